//! The watcher against real files and inotify: writes, renames, a ConfigMap's link swap,
//! the directory removed and made again, and 100 alternating valid and invalid rewrites.
//! Each step awaits the published value (bounded by [`WAIT`]), never a sleep.

use std::{path::Path, sync::Arc, time::Duration};

use tokio::sync::watch::{Receiver, channel};

use super::{super::Serving, super::tests::*, *};

/// Longest wait for one change to be published.
const WAIT: Duration = Duration::from_secs(10);

fn start(dir: &Path) -> (WatchHandle, Receiver<Arc<Accepted>>) {
    let (tx, rx) = channel(Arc::new(Accepted::default()));
    let handle = watch(dir.to_path_buf(), V, tx).unwrap();
    (handle, rx)
}

/// The first published value `done` accepts; every value seen on the way must pass
/// `always`.
async fn until(
    rx: &mut Receiver<Arc<Accepted>>,
    what: &str,
    done: impl Fn(&Accepted) -> bool,
    always: impl Fn(&Accepted),
) -> Arc<Accepted> {
    let deadline = Instant::now() + WAIT;
    loop {
        let a = rx.borrow_and_update().clone();
        always(&a);
        if done(&a) {
            return a;
        }
        tokio::time::timeout_at(deadline, rx.changed())
            .await
            .unwrap_or_else(|_| panic!("{what}: not published within {WAIT:?}"))
            .expect("the watcher keeps its sender");
    }
}

async fn until_priority(rx: &mut Receiver<Arc<Accepted>>, name: &str, p: Option<i32>) {
    let what = format!("{name} at priority {p:?}");
    until(rx, &what, |a| priority(a, name) == p, |_| {}).await;
}

#[tokio::test]
async fn writes_renames_and_removals_are_published() {
    let d = TempDir::new("watch");
    d.write("t.yaml", &tenant("team-a", 1));
    let (handle, mut rx) = start(&d.0);
    // The first load is published before watch returns.
    assert_eq!(rx.borrow_and_update().generation, 1);
    assert_eq!(priority(&rx.borrow(), "team-a"), Some(1));

    d.write("t.yaml", &tenant("team-a", 2));
    until_priority(&mut rx, "team-a", Some(2)).await;
    d.replace("t.yaml", &tenant("team-a", 3));
    until_priority(&mut rx, "team-a", Some(3)).await;
    d.replace("u.yaml", &tenant("team-b", 1));
    until_priority(&mut rx, "team-b", Some(1)).await;
    std::fs::remove_file(d.path("t.yaml")).unwrap();
    let a = until(
        &mut rx,
        "team-a removed",
        |a| priority(a, "team-a").is_none(),
        |_| {},
    )
    .await;
    assert_eq!(a.generation, 5);

    let counts = handle.counts();
    // The first load and the four changes, each applied by one reload at least; a reload
    // may find nothing new (a write seen in two parts), none finds anything to reject.
    assert!(counts.applied >= 5, "{counts:?}");
    assert_eq!((counts.rejected, counts.rejected_objects), (0, 0));
    let telemetry =
        crate::telemetry::Telemetry::new(&crate::telemetry::TelemetryConfig::default()).unwrap();
    handle.observe(telemetry.meter());
    let text = telemetry.prometheus();
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
            .to_string()
    };
    assert_eq!(
        line("warmpath_policy_reloads_total{result=\"applied\""),
        format!(
            "warmpath_policy_reloads_total{{result=\"applied\"}} {}",
            counts.applied
        )
    );
    assert_eq!(
        line("warmpath_policy_rejected"),
        "warmpath_policy_rejected 0"
    );
}

#[tokio::test]
async fn a_configmap_link_swap_is_published() {
    let d = TempDir::new("watch-configmap");
    std::fs::create_dir(d.path("..2026_12_01_a")).unwrap();
    d.write("..2026_12_01_a/t.yaml", &tenant("team-a", 1));
    std::os::unix::fs::symlink("..2026_12_01_a", d.path("..data")).unwrap();
    std::os::unix::fs::symlink("..data/t.yaml", d.path("t.yaml")).unwrap();
    let (_handle, mut rx) = start(&d.0);
    assert_eq!(priority(&rx.borrow_and_update(), "team-a"), Some(1));
    // What the kubelet does: a new timestamped directory, a new link renamed over `..data`,
    // the old directory removed.
    std::fs::create_dir(d.path("..2026_12_01_b")).unwrap();
    d.write("..2026_12_01_b/t.yaml", &tenant("team-a", 2));
    std::os::unix::fs::symlink("..2026_12_01_b", d.path("..data_tmp")).unwrap();
    std::fs::rename(d.path("..data_tmp"), d.path("..data")).unwrap();
    std::fs::remove_dir_all(d.path("..2026_12_01_a")).unwrap();
    until_priority(&mut rx, "team-a", Some(2)).await;
}

#[tokio::test]
async fn a_directory_removed_and_made_again_is_watched_again() {
    let d = TempDir::new("watch-gone");
    d.write("t.yaml", &tenant("team-a", 1));
    let (_handle, mut rx) = start(&d.0);
    std::fs::remove_dir_all(&d.0).unwrap();
    std::fs::create_dir(&d.0).unwrap();
    d.write("t.yaml", &tenant("team-a", 2));
    until_priority(&mut rx, "team-a", Some(2)).await;
    // The new directory is the one watched.
    d.replace("t.yaml", &tenant("team-a", 3));
    until_priority(&mut rx, "team-a", Some(3)).await;
}

#[tokio::test]
async fn alternating_valid_and_invalid_rewrites_publish_only_valid_versions() {
    let d = TempDir::new("watch-alternate");
    d.write("t.yaml", &tenant("team-a", 0));
    d.write("marker.yaml", &tenant("marker", 0));
    let (handle, mut rx) = start(&d.0);
    // Valid priorities are 0-1000 (the tests' validator): an invalid version never serves.
    let never_invalid = |a: &Accepted| {
        let p = priority(a, "team-a");
        assert!(
            p.is_some_and(|p| (0..=1000).contains(&p)),
            "published {p:?}"
        );
    };
    let mut last_valid = 0;
    for i in 1..=100 {
        if i % 2 == 0 {
            last_valid = i;
            d.replace("t.yaml", &tenant("team-a", i));
            let what = format!("valid version {i}");
            until(
                &mut rx,
                &what,
                |a| priority(a, "team-a") == Some(i),
                never_invalid,
            )
            .await;
        } else {
            // The invalid version, then a valid change elsewhere: once that is published,
            // the load that published it read the invalid version too.
            d.replace("t.yaml", &tenant("team-a", 5000 + i));
            d.replace("marker.yaml", &tenant("marker", i));
            let what = format!("marker after invalid version {i}");
            let a = until(
                &mut rx,
                &what,
                |a| priority(a, "marker") == Some(i),
                never_invalid,
            )
            .await;
            assert_eq!(priority(&a, "team-a"), Some(last_valid));
            let o = a.object("Tenant", "team-a").unwrap();
            assert!(matches!(o.serving, Serving::LastGood { .. }), "{o:?}");
            let c = o.accepted().unwrap();
            assert_eq!(c.reason, "Invalid");
            assert_eq!(
                c.message,
                format!("spec.priority: `{}`: must be -1000 to 1000", 5000 + i)
            );
        }
    }
    let counts = handle.counts();
    assert!(counts.rejected >= 50, "{counts:?}");
    assert!(counts.applied >= 50, "{counts:?}");
    assert_eq!(counts.rejected_objects, 0);
}

#[tokio::test]
async fn a_directory_that_cannot_be_watched_is_an_error() {
    let d = TempDir::new("watch-missing");
    let missing = d.path("absent");
    let (tx, _rx) = channel(Arc::new(Accepted::default()));
    let e = watch(missing.clone(), V, tx.clone()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "policy directory {}: No such file or directory (os error 2)",
            missing.display()
        )
    );
    d.write("file.yaml", "");
    let e = watch(d.path("file.yaml"), V, tx).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "policy directory {}: not a directory",
            d.path("file.yaml").display()
        )
    );
}

#[test]
fn watching_needs_a_runtime() {
    let d = TempDir::new("watch-runtime");
    let (tx, _rx) = channel(Arc::new(Accepted::default()));
    let e = watch(d.0.clone(), V, tx).unwrap_err();
    assert!(matches!(e, Error::NoRuntime { .. }), "{e}");
}
