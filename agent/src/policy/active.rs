//! The policy in effect: the current [`PolicySet`], swapped whole when resources change
//! (lock-free for readers: one atomic load per request), and what compiling said about
//! each object (for `warmpath status`).

use std::{
    collections::HashMap,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::Mutex;

use super::{
    compiled::{CompileInput, PolicySet, PoolBase, Tokens, compile},
    resources::Resource,
    store::Accepted,
};
use crate::tenant::{TenantPolicy, Workloads};

/// The current policy set and how it was made.
#[derive(Debug)]
pub struct ActivePolicy {
    current: ArcSwap<PolicySet>,
    inputs: Mutex<Inputs>,
    /// Sets published (each reload that changed something, plus pool additions).
    generation: AtomicU64,
    /// The latest load of the policy directory (statuses), when there is one.
    accepted: ArcSwapOption<Accepted>,
    /// The generation of each set published, for whoever follows changes (status writers).
    published: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug)]
struct Inputs {
    pools: Vec<PoolBase>,
    identity: TenantPolicy,
    resources: Vec<Resource>,
    /// Tokenizers loaded for `huggingface` token sources, by directory.
    tokenizers: HashMap<String, Tokens>,
    /// On Kubernetes, client pods by address (tenants' workload selectors match through it).
    workloads: Option<Arc<dyn Workloads>>,
}

/// The built-in tokenizer, loaded on first use.
fn builtin() -> Tokens {
    static BUILTIN: OnceLock<Tokens> = OnceLock::new();
    BUILTIN
        .get_or_init(|| {
            use warmpath_tokenizer::{Tokenizer, segments::SegmentTokenizer};
            Tokens::Local(Arc::new(SegmentTokenizer::new(Arc::new(
                Tokenizer::builtin(),
            ))))
        })
        .clone()
}

impl ActivePolicy {
    /// The configuration alone (no resources yet).
    pub fn new(identity: TenantPolicy) -> Self {
        let mut inputs = Inputs {
            pools: Vec::new(),
            identity,
            resources: Vec::new(),
            tokenizers: HashMap::new(),
            workloads: None,
        };
        let set = build(&mut inputs, 0);
        Self {
            current: ArcSwap::from_pointee(set),
            inputs: Mutex::new(inputs),
            generation: AtomicU64::new(0),
            accepted: ArcSwapOption::empty(),
            published: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Changes whenever a set is published (a reload, a pool added or retargeted); the value
    /// is the set's generation.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.published.subscribe()
    }

    /// The set in effect now (hold it for one request; a reload publishes a new one).
    pub fn current(&self) -> Arc<PolicySet> {
        self.current.load_full()
    }

    /// Adds a pool of the configuration (at start, before traffic).
    pub fn add_pool(&self, pool: PoolBase) {
        let mut inputs = self.inputs.lock();
        inputs.pools.push(pool);
        self.publish(&mut inputs);
    }

    /// Compiles `resources` (accepted: validated) over the configuration and publishes the
    /// result; requests in progress keep the set they started with.
    pub fn apply(&self, resources: Vec<Resource>) -> Arc<PolicySet> {
        let mut inputs = self.inputs.lock();
        inputs.resources = resources;
        self.publish(&mut inputs)
    }

    /// Applies a load of the policy directory: what serves, and the statuses to show.
    pub fn apply_accepted(&self, accepted: Arc<Accepted>) -> Arc<PolicySet> {
        use super::store::Serving;
        let unchanged = self
            .accepted
            .load()
            .as_ref()
            .is_some_and(|a| a.generation == accepted.generation);
        if unchanged {
            // Only statuses changed (an update was rejected): what serves stays.
            self.accepted.store(Some(accepted));
            return self.current();
        }
        // Each serving version carries its generation (explain headers, status).
        let mut resources = accepted.resources.clone();
        for r in &mut resources {
            let (kind, key) = (r.kind(), r.key());
            let generation = accepted.object(kind, &key).and_then(|o| match o.serving {
                Serving::Current => Some(o.observed_generation),
                Serving::LastGood { generation } => Some(generation),
                Serving::None => None,
            });
            let meta = match r {
                Resource::RoutePolicy(p) => &mut p.metadata,
                Resource::Tenant(t) => &mut t.metadata,
            };
            if meta.generation.is_none() {
                meta.generation = generation;
            }
        }
        let set = self.apply(resources);
        self.accepted.store(Some(accepted));
        set
    }

    /// The latest load of the policy directory.
    pub fn accepted(&self) -> Option<Arc<Accepted>> {
        self.accepted.load_full()
    }

    /// Matches the tenants' workload selectors through `workloads` (on Kubernetes, the
    /// pod directory), before CIDRs, from the next set on — published now.
    pub fn set_workloads(&self, workloads: Arc<dyn Workloads>) {
        let mut inputs = self.inputs.lock();
        inputs.workloads = Some(workloads);
        self.publish(&mut inputs);
    }

    /// Resolves intercepted clients' cgroups through `cgroups` (on Kubernetes, the pods'
    /// cgroups) before the configuration's `tenants.cgroups`, from the next set on —
    /// published now.
    pub fn set_cgroups(&self, cgroups: Arc<dyn crate::tenant::CgroupDirectory>) {
        let mut inputs = self.inputs.lock();
        let layered: Arc<dyn crate::tenant::CgroupDirectory> = match inputs.identity.cgroups.take()
        {
            Some(then) => Arc::new(crate::tenant::LayeredCgroups {
                first: cgroups,
                then,
            }),
            None => cgroups,
        };
        inputs.identity.cgroups = Some(layered);
        self.publish(&mut inputs);
    }

    /// Sets what `RoutePolicy` targets name the configured pool `name` by (its labels,
    /// Services and, on Kubernetes, its `InferencePool`) and publishes.
    pub fn set_pool_targets(&self, name: &str, targets: super::compiled::PoolTargets) {
        let mut inputs = self.inputs.lock();
        if let Some(p) = inputs.pools.iter_mut().find(|p| p.name == name) {
            p.targets = targets;
        }
        self.publish(&mut inputs);
    }

    fn publish(&self, inputs: &mut Inputs) -> Arc<PolicySet> {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let set = Arc::new(build(inputs, generation));
        if let Some(w) = &inputs.workloads {
            w.select(set.workload_selectors.clone());
        }
        self.current.store(set.clone());
        self.published.send_replace(generation);
        set
    }
}

fn build(inputs: &mut Inputs, generation: u64) -> PolicySet {
    let Inputs {
        pools,
        identity,
        resources,
        tokenizers,
        workloads,
    } = inputs;
    let mut load = |dir: &str| -> Result<Tokens, String> {
        if let Some(t) = tokenizers.get(dir) {
            return Ok(t.clone());
        }
        use warmpath_tokenizer::{Tokenizer, segments::SegmentTokenizer};
        let tok = Tokenizer::from_dir(std::path::Path::new(dir)).map_err(|e| e.to_string())?;
        let source = Tokens::Local(Arc::new(SegmentTokenizer::new(Arc::new(tok))));
        tokenizers.insert(dir.to_string(), source.clone());
        Ok(source)
    };
    compile(
        CompileInput {
            pools,
            identity,
            tokenizers: &mut load,
            builtin: &builtin,
            workloads: workloads.as_ref(),
        },
        resources,
        generation,
    )
}
