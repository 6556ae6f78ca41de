//! This agent's place in the cluster's order: its position among the live members' node ids,
//! kept current as members come and go, for the staggered cold decisions
//! ([`crate::routing::stagger`]).

use std::sync::{Arc, Weak};

use tokio::task::JoinHandle;

use super::{ClusterNode, membership::Membership};
use crate::routing::stagger;

/// Follows the live members of `node` and sets this agent's `slot` on each change. The task
/// ends when the membership is dropped (the slot goes back to the first: a lone agent holds
/// nothing); the agent aborts it with its other tasks at shutdown.
pub fn spawn_order_watch(node: &ClusterNode, slot: Arc<stagger::Slot>) -> JoinHandle<()> {
    tokio::spawn(follow(Arc::downgrade(&node.membership), slot))
}

async fn follow(membership: Weak<Membership>, slot: Arc<stagger::Slot>) {
    let (mut live, me) = match membership.upgrade() {
        Some(m) => (m.watch().await, m.node_id().to_string()),
        None => return,
    };
    drop(membership);
    loop {
        let position = {
            let members = live.borrow_and_update();
            let ids = members.keys().map(|id| &*id.node_id);
            stagger::position(&me, ids.chain(std::iter::once(me.as_str())))
        };
        slot.set_position(position);
        if live.changed().await.is_err() {
            slot.set_position(0);
            return;
        }
    }
}
