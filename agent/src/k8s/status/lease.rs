//! Who writes statuses: the holder of one `coordination.k8s.io/v1` Lease, elected the way
//! client-go's leader election does it.
//!
//! Every [`LeaseTiming::retry`] each agent reads the Lease:
//! - absent: it creates it holding it (a create that finds it already made loses);
//! - held by another: whenever the record changes (its resourceVersion) the agent notes the
//!   time on its own clock; it takes over only once the record has not changed for
//!   [`LeaseTiming::duration`] on that clock — never by comparing the holder's `renewTime`
//!   with its own wall clock, so skew between nodes does not matter;
//! - held by itself, or free, or expired: it writes itself as holder (renewTime now; on a
//!   takeover acquireTime now and `leaseTransitions` + 1) with a PUT conditional on the
//!   resourceVersion it read: of two agents writing at once, one gets `409 Conflict` and
//!   stays a follower.
//!
//! The holder leads until [`LeaseTiming::renew_deadline`] after its last successful write
//! (shorter than the duration others wait): when renewing fails (the API unreachable, a
//! conflict, the Lease taken) it stops writing statuses at that deadline at the latest, and
//! at once when it learns another agent holds the Lease.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, api::PostParams};
use tokio::time::Instant;

/// How long a Lease lasts and how often it is renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// `spec.leaseDurationSeconds`: others take over after the record has not changed this
    /// long.
    pub duration: Duration,
    /// The holder stops leading this long after its last successful renewal.
    pub renew_deadline: Duration,
    /// How often the Lease is read and, by its holder, renewed.
    pub retry: Duration,
}

impl Default for LeaseTiming {
    /// 15 s, 10 s, 5 s: client-go's defaults are 15 s, 10 s, 2 s; statuses need no faster
    /// failover than 15 s, and a renewal every 5 s is 0.2 writes/s per cluster.
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(5),
        }
    }
}

/// The fields of a Lease the election reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `metadata.resourceVersion`: the precondition of the next write.
    pub resource_version: String,
    pub holder: Option<String>,
    pub duration_seconds: Option<i32>,
    pub acquired: Option<Timestamp>,
    pub renewed: Option<Timestamp>,
    pub transitions: i32,
}

/// Why a Lease call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Another writer came first: the record changed since it was read (or already exists).
    #[error("the Lease was written by another agent first")]
    Conflict,
    #[error("Lease API call failed: {0}")]
    Api(String),
}

/// The three calls the election makes, over the API or (tests) in memory.
pub trait LeaseApi: Send + Sync + 'static {
    /// The Lease, `None` when there is none.
    fn get(&self) -> impl Future<Output = Result<Option<LeaseRecord>, LeaseError>> + Send;
    /// Creates the Lease; [`LeaseError::Conflict`] when it exists.
    fn create(
        &self,
        record: &LeaseRecord,
    ) -> impl Future<Output = Result<LeaseRecord, LeaseError>> + Send;
    /// Replaces the Lease when its resourceVersion is still `record.resource_version`;
    /// [`LeaseError::Conflict`] otherwise.
    fn replace(
        &self,
        record: &LeaseRecord,
    ) -> impl Future<Output = Result<LeaseRecord, LeaseError>> + Send;
}

/// One contender.
#[derive(Debug)]
pub struct Elector<A> {
    api: A,
    holder: String,
    timing: LeaseTiming,
    /// The record last read or written, and when (on this agent's clock) it last changed.
    observed: Option<(LeaseRecord, Instant)>,
    /// The last successful acquisition or renewal.
    renewed: Option<Instant>,
}

// === impl Elector ===

impl<A: LeaseApi> Elector<A> {
    pub fn new(api: A, holder: String, timing: LeaseTiming) -> Self {
        Self {
            api,
            holder,
            timing,
            observed: None,
            renewed: None,
        }
    }

    /// Tries to acquire or renew; `Some(until)`: this agent leads until then.
    pub async fn tick(&mut self) -> Option<Instant> {
        let now = Instant::now();
        match self.try_acquire_or_renew(now).await {
            Ok(true) => {
                self.renewed = Some(now);
                Some(now + self.timing.renew_deadline)
            }
            Ok(false) => {
                if self.renewed.take().is_some() {
                    tracing::info!(holder = %self.holder, "status Lease lost: another agent writes statuses");
                }
                None
            }
            Err(e) => {
                let until = self
                    .renewed
                    .map(|r| r + self.timing.renew_deadline)
                    .filter(|u| *u > now);
                tracing::warn!(holder = %self.holder, error = %e, leading = until.is_some(), "status Lease not renewed");
                until
            }
        }
    }

    async fn try_acquire_or_renew(&mut self, now: Instant) -> Result<bool, LeaseError> {
        let wall = Timestamp::now();
        let Some(current) = self.api.get().await? else {
            let record = LeaseRecord {
                resource_version: String::new(),
                holder: Some(self.holder.clone()),
                duration_seconds: Some(self.duration_seconds()),
                acquired: Some(wall),
                renewed: Some(wall),
                transitions: 0,
            };
            return match self.api.create(&record).await {
                Ok(made) => {
                    self.observe(made, now);
                    tracing::info!(holder = %self.holder, "status Lease created: this agent writes statuses");
                    Ok(true)
                }
                Err(LeaseError::Conflict) => Ok(false),
                Err(e) => Err(e),
            };
        };
        self.observe(current.clone(), now);
        let mine = current.holder.as_deref() == Some(self.holder.as_str());
        let held = current.holder.as_deref().is_some_and(|h| !h.is_empty());
        if held && !mine {
            let duration = current
                .duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.timing.duration, Duration::from_secs);
            let since = self.observed.as_ref().map_or(now, |(_, at)| *at);
            if now < since + duration {
                return Ok(false);
            }
        }
        let mut next = current.clone();
        if !mine {
            next.acquired = Some(wall);
            next.transitions = current.transitions.saturating_add(1);
        }
        next.holder = Some(self.holder.clone());
        next.renewed = Some(wall);
        next.duration_seconds = Some(self.duration_seconds());
        match self.api.replace(&next).await {
            Ok(written) => {
                self.observe(written, now);
                if !mine {
                    tracing::info!(holder = %self.holder, previous = ?current.holder, "status Lease taken over: this agent writes statuses");
                }
                Ok(true)
            }
            Err(LeaseError::Conflict) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Hands the Lease back when this agent holds it: holder cleared, duration 1 s, so the
    /// next agent to read it takes it at once.
    pub async fn release(&mut self) {
        if self.renewed.take().is_none() {
            return;
        }
        let Some((mine, _)) = self.observed.clone() else {
            return;
        };
        if mine.holder.as_deref() != Some(self.holder.as_str()) {
            return;
        }
        let released = LeaseRecord {
            holder: None,
            duration_seconds: Some(1),
            renewed: Some(Timestamp::now()),
            ..mine
        };
        match self.api.replace(&released).await {
            Ok(_) => tracing::info!(holder = %self.holder, "status Lease released"),
            Err(e) => {
                tracing::warn!(holder = %self.holder, error = %e, "status Lease not released; it expires instead")
            }
        }
    }

    /// Notes `record`, and `now` as its time when it differs from the one observed.
    fn observe(&mut self, record: LeaseRecord, now: Instant) {
        let same = self
            .observed
            .as_ref()
            .is_some_and(|(r, _)| r.resource_version == record.resource_version);
        if !same {
            self.observed = Some((record, now));
        }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.timing.duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// The Lease `name` in a namespace, over the API.
#[derive(Debug, Clone)]
pub struct KubeLease {
    pub api: Api<Lease>,
    pub name: String,
}

impl LeaseApi for KubeLease {
    async fn get(&self) -> Result<Option<LeaseRecord>, LeaseError> {
        let lease = self.api.get_opt(&self.name).await.map_err(api_error)?;
        Ok(lease.map(|l| record(&l)))
    }

    async fn create(&self, r: &LeaseRecord) -> Result<LeaseRecord, LeaseError> {
        let lease = self.lease(r, None);
        let made = self
            .api
            .create(&PostParams::default(), &lease)
            .await
            .map_err(api_error)?;
        Ok(record(&made))
    }

    async fn replace(&self, r: &LeaseRecord) -> Result<LeaseRecord, LeaseError> {
        let lease = self.lease(r, Some(r.resource_version.clone()));
        let written = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(api_error)?;
        Ok(record(&written))
    }
}

impl KubeLease {
    fn lease(&self, r: &LeaseRecord, resource_version: Option<String>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version,
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: r.holder.clone(),
                lease_duration_seconds: r.duration_seconds,
                acquire_time: r.acquired.map(MicroTime),
                renew_time: r.renewed.map(MicroTime),
                lease_transitions: Some(r.transitions),
                ..LeaseSpec::default()
            }),
        }
    }
}

fn record(l: &Lease) -> LeaseRecord {
    let spec = l.spec.clone().unwrap_or_default();
    LeaseRecord {
        resource_version: l.metadata.resource_version.clone().unwrap_or_default(),
        holder: spec.holder_identity,
        duration_seconds: spec.lease_duration_seconds,
        acquired: spec.acquire_time.map(|t| t.0),
        renewed: spec.renew_time.map(|t| t.0),
        transitions: spec.lease_transitions.unwrap_or(0),
    }
}

fn api_error(e: kube::Error) -> LeaseError {
    match &e {
        kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() => LeaseError::Conflict,
        _ => LeaseError::Api(e.to_string()),
    }
}
