//! Loads of a policy directory: statuses, last good versions, files that do not parse,
//! deletions, generations, conflicts and bounds. The validator here is the tests' own (its
//! verdicts are known to the tests), not `policy::validate`.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, SystemTime},
};

use super::{dir::is_policy_file, *};
use crate::policy::resources::Tenant;

/// 2023-11-14T22:13:20Z.
pub(super) const T1: u64 = 1_700_000_000;
pub(super) const T1_TEXT: &str = "2023-11-14T22:13:20Z";
pub(super) const T2_TEXT: &str = "2023-11-14T22:14:20Z";

pub(super) fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// A directory under the system's temporary directory, removed on drop.
pub(super) struct TempDir(pub PathBuf);

impl TempDir {
    pub(super) fn new(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("warmpath-store-{}-{name}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes in place (truncate, write).
    pub(super) fn write(&self, name: &str, text: &str) {
        std::fs::write(self.path(name), text).unwrap();
    }

    /// Writes a hidden temporary file and renames it over `name`, as editors and kubectl do.
    pub(super) fn replace(&self, name: &str, text: &str) {
        let tmp = self.path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.path(name)).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn tenant(name: &str, priority: i32) -> String {
    format!(
        "---\napiVersion: warmpath.dev/v1alpha1\nkind: Tenant\nmetadata: {{name: {name}}}\n\
         spec: {{priority: {priority}}}\n"
    )
}

fn tenant_cidr(name: &str, cidr: &str) -> String {
    format!(
        "---\napiVersion: warmpath.dev/v1alpha1\nkind: Tenant\nmetadata: {{name: {name}}}\n\
         spec: {{identity: {{cidrs: [{cidr}]}}}}\n"
    )
}

fn policy(ns: &str, name: &str, retries: u32) -> String {
    format!(
        "---\napiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\n\
         metadata: {{name: {name}, namespace: {ns}}}\n\
         spec: {{targetRef: {{pool: {{name: chat}}}}, action: {{retries: {retries}}}}}\n"
    )
}

/// Tenants' priorities must be -1000 to 1000, policies' retries at most 16.
fn check_object(r: &Resource) -> Vec<FieldError> {
    let e = |path: &str, value: String, message: &str| FieldError {
        path: path.into(),
        value,
        message: message.into(),
    };
    match r {
        Resource::Tenant(t) if !(-1000..=1000).contains(&t.spec.priority) => vec![e(
            "spec.priority",
            t.spec.priority.to_string(),
            "must be -1000 to 1000",
        )],
        Resource::RoutePolicy(p) if p.spec.action.retries.is_some_and(|n| n > 16) => vec![e(
            "spec.action.retries",
            p.spec.action.retries.unwrap_or(0).to_string(),
            "at most 16",
        )],
        _ => vec![],
    }
}

/// Two tenants claiming one CIDR: the later by name is rejected.
fn check_set(rs: &[Resource]) -> Vec<(String, FieldError)> {
    let mut tenants: Vec<&Tenant> = rs
        .iter()
        .filter_map(|r| match r {
            Resource::Tenant(t) => Some(t),
            Resource::RoutePolicy(_) => None,
        })
        .collect();
    tenants.sort_by_key(|t| t.metadata.name.clone());
    let mut claimed: Vec<(&str, &str)> = Vec::new();
    let mut out = Vec::new();
    for t in tenants {
        let name = t.metadata.name.as_deref().unwrap_or("");
        for (i, c) in t.spec.identity.cidrs.iter().enumerate() {
            match claimed.iter().find(|(cidr, _)| cidr == c) {
                Some((_, other)) => out.push((
                    name.to_string(),
                    FieldError {
                        path: format!("spec.identity.cidrs[{i}]"),
                        value: c.clone(),
                        message: format!("also claimed by tenant {other}"),
                    },
                )),
                None => claimed.push((c, name)),
            }
        }
    }
    out
}

pub(super) const V: Validator = Validator {
    object: check_object,
    set: check_set,
};

fn cond(status: &str, reason: &str, message: &str, generation: i64, time: &str) -> Vec<Condition> {
    vec![Condition {
        type_: "Accepted".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: Some(generation),
        last_transition_time: time.into(),
    }]
}

fn keys(a: &Accepted) -> Vec<String> {
    a.resources
        .iter()
        .map(|r| format!("{} {}", r.kind(), r.key()))
        .collect()
}

pub(super) fn priority(a: &Accepted, name: &str) -> Option<i32> {
    a.resources.iter().find_map(|r| match r {
        Resource::Tenant(t) if t.metadata.name.as_deref() == Some(name) => Some(t.spec.priority),
        _ => None,
    })
}

#[test]
fn valid_and_invalid_objects_have_exact_statuses() {
    let d = TempDir::new("statuses");
    d.write("a.yaml", &(tenant("team-a", 1) + &tenant("team-b", 5000)));
    d.write("b.yml", &policy("ml", "canary", 2));
    let a = load_at(&d.0, &V, None, at(T1));
    assert_eq!(a.generation, 1);
    assert_eq!(keys(&a), ["RoutePolicy ml/canary", "Tenant team-a"]);
    let status = |kind, key: &str, file: &str, serving, conditions| ObjectStatus {
        kind,
        key: key.into(),
        file: d.path(file),
        observed_generation: 1,
        serving,
        conditions,
    };
    assert_eq!(
        a.objects,
        [
            status(
                "RoutePolicy",
                "ml/canary",
                "b.yml",
                Serving::Current,
                cond("True", "Accepted", "generation 1 serves", 1, T1_TEXT)
            ),
            status(
                "Tenant",
                "team-a",
                "a.yaml",
                Serving::Current,
                cond("True", "Accepted", "generation 1 serves", 1, T1_TEXT)
            ),
            status(
                "Tenant",
                "team-b",
                "a.yaml",
                Serving::None,
                cond(
                    "False",
                    "Invalid",
                    "spec.priority: `5000`: must be -1000 to 1000",
                    1,
                    T1_TEXT
                )
            ),
        ]
    );
    assert_eq!(
        a.files,
        [
            FileStatus {
                file: d.path("a.yaml"),
                error: None
            },
            FileStatus {
                file: d.path("b.yml"),
                error: None
            },
        ]
    );
    assert_eq!(a.rejected(), 1);
    let s = a.object("Tenant", "team-b").unwrap().status();
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(s.conditions[0].reason, "Invalid");
}

#[test]
fn an_invalid_update_keeps_the_last_good_version_serving() {
    let d = TempDir::new("last-good");
    d.write("t.yaml", &tenant("team-a", 1));
    let v1 = load_at(&d.0, &V, None, at(T1));
    d.write("t.yaml", &tenant("team-a", 5000));
    let v2 = load_at(&d.0, &V, Some(&v1), at(T1 + 60));
    // What serves did not change: same generation, the old version.
    assert_eq!(v2.generation, 1);
    assert_eq!(v2.resources, v1.resources);
    assert_eq!(priority(&v2, "team-a"), Some(1));
    let o = v2.object("Tenant", "team-a").unwrap();
    assert_eq!(o.serving, Serving::LastGood { generation: 1 });
    assert_eq!(o.observed_generation, 2);
    assert_eq!(
        o.conditions,
        cond(
            "False",
            "Invalid",
            "spec.priority: `5000`: must be -1000 to 1000",
            2,
            T2_TEXT
        )
    );
    assert_eq!(v2.rejected(), 1);

    // Loaded again unchanged: nothing moves, the transition time included.
    let v3 = load_at(&d.0, &V, Some(&v2), at(T1 + 120));
    assert_eq!(v3, v2);

    // Fixed: the new version serves, at the next generation of both.
    d.write("t.yaml", &tenant("team-a", 3));
    let v4 = load_at(&d.0, &V, Some(&v3), at(T1 + 180));
    assert_eq!(v4.generation, 2);
    assert_eq!(priority(&v4, "team-a"), Some(3));
    let o = v4.object("Tenant", "team-a").unwrap();
    assert_eq!(o.serving, Serving::Current);
    assert_eq!(o.observed_generation, 3);
    assert_eq!(o.conditions[0].status, "True");
    assert_eq!(o.conditions[0].last_transition_time, "2023-11-14T22:16:20Z");
}

#[test]
fn a_file_that_does_not_parse_keeps_all_its_objects() {
    let d = TempDir::new("parse");
    d.write("a.yaml", &(tenant("team-a", 1) + &tenant("team-b", 5000)));
    d.write("b.yaml", &tenant("team-c", 1));
    let v1 = load_at(&d.0, &V, None, at(T1));
    d.write("a.yaml", &tenant("team-a", 2).replace("priority", "{{{"));
    d.write("b.yaml", &tenant("team-c", 7));
    let v2 = load_at(&d.0, &V, Some(&v1), at(T1 + 60));
    // b.yaml's change applies; a.yaml's objects stay as they were.
    assert_eq!(v2.generation, 2);
    assert_eq!(priority(&v2, "team-a"), Some(1));
    assert_eq!(priority(&v2, "team-c"), Some(7));
    let error = v2.files[0].error.clone().unwrap();
    assert!(error.starts_with(&format!("{}: document 1", d.path("a.yaml").display())));
    assert_eq!(v2.files[1].error, None);
    let a = v2.object("Tenant", "team-a").unwrap();
    assert_eq!(a.serving, Serving::LastGood { generation: 1 });
    assert_eq!(a.observed_generation, 1);
    assert_eq!(a.conditions, cond("False", "FileError", &error, 1, T2_TEXT));
    // An object that never served still does not.
    let b = v2.object("Tenant", "team-b").unwrap();
    assert_eq!(b.serving, Serving::None);
    assert_eq!(b.conditions[0].reason, "FileError");
    assert_eq!(b.conditions[0].last_transition_time, T1_TEXT);
    assert_eq!(v2.rejected(), 2);

    // A file that cannot be read is the same.
    std::fs::write(d.path("a.yaml"), [b'a', 0xff, 0xfe]).unwrap();
    let v3 = load_at(&d.0, &V, Some(&v2), at(T1 + 120));
    assert!(v3.files[0].error.as_deref().unwrap().contains("not UTF-8"));
    assert_eq!(priority(&v3, "team-a"), Some(1));
}

#[test]
fn deleted_objects_and_files_disappear() {
    let d = TempDir::new("delete");
    d.write("a.yaml", &(tenant("team-a", 1) + &tenant("team-b", 1)));
    d.write("b.yaml", &policy("ml", "canary", 1));
    let v1 = load_at(&d.0, &V, None, at(T1));
    assert_eq!(v1.resources.len(), 3);
    d.write("a.yaml", &tenant("team-a", 1));
    let v2 = load_at(&d.0, &V, Some(&v1), at(T1));
    assert_eq!(keys(&v2), ["RoutePolicy ml/canary", "Tenant team-a"]);
    assert_eq!(v2.generation, 2);
    assert!(v2.object("Tenant", "team-b").is_none());
    std::fs::remove_file(d.path("b.yaml")).unwrap();
    let v3 = load_at(&d.0, &V, Some(&v2), at(T1));
    assert_eq!(keys(&v3), ["Tenant team-a"]);
    assert_eq!(v3.generation, 3);
    assert_eq!(v3.files.len(), 1);
    assert_eq!(v3.rejected(), 0);
    // An object whose last version was invalid disappears too (a deletion is valid).
    d.write("a.yaml", &tenant("team-a", 9999));
    let v4 = load_at(&d.0, &V, Some(&v3), at(T1));
    assert_eq!(priority(&v4, "team-a"), Some(1));
    d.write("a.yaml", "");
    let v5 = load_at(&d.0, &V, Some(&v4), at(T1));
    assert!(v5.resources.is_empty() && v5.objects.is_empty());
    assert_eq!(v5.generation, 4);
}

#[test]
fn generations_count_spec_changes_or_come_from_metadata() {
    let d = TempDir::new("generations");
    d.write("a.yaml", &tenant("team-a", 1));
    let v1 = load_at(&d.0, &V, None, at(T1));
    let generation = |a: &Accepted| a.object("Tenant", "team-a").unwrap().observed_generation;
    assert_eq!(generation(&v1), 1);
    // Metadata only: the object's generation stays, but what serves changed.
    let labelled = tenant("team-a", 1).replace("{name: team-a}", "{name: team-a, labels: {x: y}}");
    d.write("a.yaml", &labelled);
    let v2 = load_at(&d.0, &V, Some(&v1), at(T1));
    assert_eq!(generation(&v2), 1);
    assert_eq!(v2.generation, 2);
    // The spec: one more.
    d.write("a.yaml", &labelled.replace("priority: 1", "priority: 2"));
    let v3 = load_at(&d.0, &V, Some(&v2), at(T1));
    assert_eq!(generation(&v3), 2);
    assert_eq!(v3.generation, 3);
    // Given in metadata: taken as is.
    d.write(
        "a.yaml",
        &tenant("team-a", 2).replace("{name: team-a}", "{name: team-a, generation: 40}"),
    );
    let v4 = load_at(&d.0, &V, Some(&v3), at(T1));
    assert_eq!(generation(&v4), 40);
    assert_eq!(
        v4.object("Tenant", "team-a").unwrap().conditions[0].observed_generation,
        Some(40)
    );
    // Counting goes on from there when it is dropped.
    d.write("a.yaml", &tenant("team-a", 5));
    let v5 = load_at(&d.0, &V, Some(&v4), at(T1));
    assert_eq!(generation(&v5), 41);
    // The same bytes again: the same result.
    assert_eq!(load_at(&d.0, &V, Some(&v5), at(T1 + 5)), v5);
}

#[test]
fn conflicts_reject_the_object_the_set_check_names() {
    let d = TempDir::new("conflicts");
    d.write("a.yaml", &tenant_cidr("team-a", "127.0.0.2/32"));
    d.write("b.yaml", &tenant_cidr("team-b", "127.0.0.3/32"));
    let v1 = load_at(&d.0, &V, None, at(T1));
    assert_eq!(keys(&v1), ["Tenant team-a", "Tenant team-b"]);
    // team-b claims team-a's address: its new version is rejected, its last good serves.
    d.write("b.yaml", &tenant_cidr("team-b", "127.0.0.2/32"));
    let v2 = load_at(&d.0, &V, Some(&v1), at(T1 + 60));
    assert_eq!(v2.resources, v1.resources);
    let b = v2.object("Tenant", "team-b").unwrap();
    assert_eq!(b.serving, Serving::LastGood { generation: 1 });
    assert_eq!(
        b.conditions,
        cond(
            "False",
            "Conflicted",
            "spec.identity.cidrs[0]: `127.0.0.2/32`: also claimed by tenant team-a",
            2,
            T2_TEXT
        )
    );
    // A new tenant with no earlier version is simply absent.
    d.write("c.yaml", &tenant_cidr("team-c", "127.0.0.2/32"));
    let v3 = load_at(&d.0, &V, Some(&v2), at(T1 + 60));
    assert_eq!(
        v3.object("Tenant", "team-c").unwrap().serving,
        Serving::None
    );
    assert_eq!(keys(&v3), ["Tenant team-a", "Tenant team-b"]);

    // The same object in two files: the first file's serves, the other is rejected.
    d.write("c.yaml", &tenant("team-a", 4));
    let v4 = load_at(&d.0, &V, Some(&v3), at(T1 + 60));
    assert_eq!(keys(&v4), ["Tenant team-a", "Tenant team-b"]);
    let both: Vec<_> = v4.objects.iter().filter(|o| o.key == "team-a").collect();
    assert_eq!(both.len(), 2);
    assert_eq!(
        (both[0].file.clone(), both[0].serving),
        (d.path("a.yaml"), Serving::Current)
    );
    assert_eq!(
        (both[1].file.clone(), both[1].serving),
        (d.path("c.yaml"), Serving::None)
    );
    assert_eq!(
        both[1].conditions[0].message,
        format!(
            "Tenant team-a is also defined in {}, the definition in use: an object is defined once",
            d.path("a.yaml").display()
        )
    );
    assert_eq!(v4.rejected(), 2);
}

#[test]
fn only_policy_files_are_read() {
    for (name, read) in [
        ("a.yaml", true),
        ("a.yml", true),
        ("a.json", true),
        (".a.yaml", false),
        (".#a.yaml", false),
        ("a.yaml~", false),
        (".a.yaml.swp", false),
        ("#a.yaml#", false),
        ("..data", false),
        ("a.txt", false),
        (".yaml", false),
        ("a.YAML", false),
    ] {
        assert_eq!(is_policy_file(name), read, "{name}");
    }
    let d = TempDir::new("names");
    d.write("a.json", r#"{"apiVersion": "warmpath.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "json"}, "spec": {}}"#);
    d.write(".#b.yaml", &tenant("emacs", 1));
    d.write("b.yaml~", &tenant("backup", 1));
    d.write("notes.txt", "not read");
    std::fs::create_dir(d.path("dir.yaml")).unwrap();
    std::os::unix::fs::symlink(d.path("gone.yaml"), d.path("dangling.yaml")).unwrap();
    let a = load_at(&d.0, &V, None, at(T1));
    assert_eq!(keys(&a), ["Tenant json"]);
    assert_eq!(a.files.len(), 1);
}

#[test]
fn a_configmap_mount_is_read_through_its_links() {
    let d = TempDir::new("configmap");
    std::fs::create_dir(d.path("..2026_12_01_a")).unwrap();
    d.write("..2026_12_01_a/t.yaml", &tenant("team-a", 1));
    std::os::unix::fs::symlink("..2026_12_01_a", d.path("..data")).unwrap();
    std::os::unix::fs::symlink("..data/t.yaml", d.path("t.yaml")).unwrap();
    let a = load_at(&d.0, &V, None, at(T1));
    assert_eq!(keys(&a), ["Tenant team-a"]);
    assert_eq!(a.files.len(), 1);
}

#[test]
fn bounds_are_errors_in_the_status() {
    let d = TempDir::new("bounds");
    let big = format!("# {}\n", "x".repeat(documents::MAX_FILE_BYTES));
    d.write("big.yaml", &big);
    let a = load_at(&d.0, &V, None, at(T1));
    assert!(
        a.files[0].error.as_deref().unwrap().contains("byte limit"),
        "{:?}",
        a.files
    );

    // MAX_FILES files, the last holding a tenant; one more file puts it beyond the limit.
    std::fs::remove_file(d.path("big.yaml")).unwrap();
    for i in 1..MAX_FILES {
        d.write(&format!("f{i:04}.yaml"), "");
    }
    d.write("zz.yaml", &tenant("team-z", 1));
    let v1 = load_at(&d.0, &V, None, at(T1));
    assert_eq!(v1.files.len(), MAX_FILES);
    assert_eq!(keys(&v1), ["Tenant team-z"]);
    d.write("f0000.yaml", "");
    let v2 = load_at(&d.0, &V, Some(&v1), at(T1));
    assert_eq!(v2.files[0].file, d.0);
    assert!(
        v2.files[0]
            .error
            .as_deref()
            .unwrap()
            .starts_with("1001 policy files, more than the 1000 read")
    );
    assert_eq!(v2.files.len(), MAX_FILES + 1);
    assert_eq!(keys(&v2), ["Tenant team-z"]);
    let z = v2.object("Tenant", "team-z").unwrap();
    assert_eq!(z.serving, Serving::LastGood { generation: 1 });
    assert_eq!(z.conditions[0].reason, "FileError");
}

#[test]
fn a_directory_gone_keeps_what_serves() {
    let d = TempDir::new("gone");
    d.write("t.yaml", &tenant("team-a", 1));
    let v1 = load_at(&d.0, &V, None, at(T1));
    std::fs::remove_dir_all(&d.0).unwrap();
    let v2 = load_at(&d.0, &V, Some(&v1), at(T1));
    assert_eq!(v2.resources, v1.resources);
    assert_eq!(v2.generation, v1.generation);
    assert_eq!(v2.objects, v1.objects);
    assert_eq!(v2.files.len(), 1);
    let e = v2.files[0].error.as_deref().unwrap();
    assert!(
        e.starts_with(&format!("cannot read {}: ", d.0.display())),
        "{e}"
    );
    assert!(
        e.ends_with("the last accepted policies keep serving"),
        "{e}"
    );
}

#[test]
fn the_default_validator_is_policy_validate() {
    let d = TempDir::new("default");
    d.write("t.yaml", &(tenant("team-a", 1) + &tenant("team-b", 5000)));
    let a = load(&d.0, &Validator::default(), None);
    assert_eq!(keys(&a), ["Tenant team-a"]);
    let b = a.object("Tenant", "team-b").unwrap();
    assert_eq!(b.conditions[0].reason, "Invalid");
    assert!(
        b.conditions[0].message.starts_with("spec.priority: `5000`"),
        "{:?}",
        b.conditions
    );
}

#[test]
fn times_are_rfc3339_utc_seconds() {
    assert_eq!(rfc3339(at(T1)), T1_TEXT);
    assert_eq!(
        rfc3339(at(0) + Duration::from_millis(1500)),
        "1970-01-01T00:00:01Z"
    );
    assert_eq!(rfc3339(at(951_782_400)), "2000-02-29T00:00:00Z");
}
