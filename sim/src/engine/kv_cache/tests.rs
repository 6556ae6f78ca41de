use super::*;

fn tokens(n: usize, base: u32) -> Vec<u32> {
    (0..n as u32).map(|i| base + i).collect()
}

/// Allocates and commits a whole request the way the scheduler does.
fn admit(pool: &mut BlockPool, toks: &[u32], extra: &ExtraKeys) -> (Vec<u32>, usize) {
    let hashes = pool.hash_blocks(toks, extra);
    let mut blocks = pool.touch_prefix(&hashes);
    let hit = blocks.len();
    let needed = toks.len().div_ceil(pool.block_size()) - blocks.len();
    blocks.extend(pool.allocate(needed).expect("room"));
    pool.commit_full_blocks(&blocks, &hashes, hit, toks, extra);
    (blocks, hit)
}

#[test]
fn shared_prefix_hits_and_stored_events_chain() {
    let mut pool = BlockPool::new(16, 4, 0);
    let extra = ExtraKeys::default();
    let a = tokens(10, 0); // 2 full blocks + 2 tokens
    let (blocks_a, hit) = admit(&mut pool, &a, &extra);
    assert_eq!((blocks_a.len(), hit), (3, 0));
    let events = pool.take_events();
    let [
        KvEvent::Stored {
            hashes,
            parent,
            token_ids,
            ..
        },
    ] = events.as_slice()
    else {
        panic!("{events:?}")
    };
    assert_eq!((hashes.len(), parent, token_ids.len()), (2, &None, 8));

    let mut b = a[..8].to_vec();
    b.extend([100, 101, 102, 103]);
    let (_, hit) = admit(&mut pool, &b, &extra);
    assert_eq!(hit, 2);
    let events = pool.take_events();
    let [
        KvEvent::Stored {
            hashes: hb, parent, ..
        },
    ] = events.as_slice()
    else {
        panic!("{events:?}")
    };
    assert_eq!(hb.len(), 1);
    assert_eq!(
        parent.as_ref(),
        Some(&hashes[1]),
        "parent is the last shared block"
    );
}

#[test]
fn salt_and_lora_change_every_hash() {
    let pool = BlockPool::new(4, 4, 0);
    let t = tokens(8, 0);
    let plain = pool.hash_blocks(&t, &ExtraKeys::default());
    let salted = pool.hash_blocks(
        &t,
        &ExtraKeys {
            cache_salt: Some("s".into()),
            ..Default::default()
        },
    );
    let lora = pool.hash_blocks(
        &t,
        &ExtraKeys {
            lora_name: Some("l".into()),
            ..Default::default()
        },
    );
    for i in 0..2 {
        assert_ne!(plain[i], salted[i]);
        assert_ne!(plain[i], lora[i]);
    }
    let keys = ExtraKeys {
        lora_name: Some("l".into()),
        cache_salt: Some("s".into()),
    };
    assert_eq!(
        keys.for_block(0),
        Some(vec!["l".to_string(), "s".to_string()])
    );
    assert_eq!(keys.for_block(1), Some(vec!["l".to_string()]));
    assert_eq!(ExtraKeys::default().for_block(0), None);
}

#[test]
fn freed_blocks_stay_cached_until_evicted_lru_tail_first() {
    let mut pool = BlockPool::new(4, 4, 0);
    let extra = ExtraKeys::default();
    let a = tokens(8, 0);
    let (blocks_a, _) = admit(&mut pool, &a, &extra);
    pool.free(&blocks_a);
    pool.take_events();
    assert_eq!(pool.cached_hashes().len(), 2);
    assert_eq!(pool.usage(), 0.0);
    // Re-admission hits both blocks although they were free.
    assert_eq!(pool.cached_prefix_len(&pool.hash_blocks(&a, &extra)), 2);

    // A 3-block request takes the 2 never-used blocks, then evicts a's LAST block first.
    let (blocks_b, _) = admit(&mut pool, &tokens(12, 1000), &extra);
    let events = pool.take_events();
    let removed: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            KvEvent::Removed { hashes, .. } => Some(hashes.clone()),
            _ => None,
        })
        .collect();
    let a_hashes = pool.hash_blocks(&a, &extra);
    assert_eq!(removed, vec![vec![a_hashes[1]]]);
    assert_eq!(pool.cached_prefix_len(&a_hashes), 1, "first block survives");
    assert!(pool.allocate(2).is_none(), "only one block left");
    pool.free(&blocks_b);
}

#[test]
fn reset_refused_while_in_use_then_clears() {
    let mut pool = BlockPool::new(4, 4, 0);
    let (blocks, _) = admit(&mut pool, &tokens(8, 0), &ExtraKeys::default());
    assert!(!pool.reset());
    pool.free(&blocks);
    assert!(pool.reset());
    assert!(pool.cached_hashes().is_empty());
    assert_eq!(pool.take_events().last(), Some(&KvEvent::AllCleared));
}

#[test]
fn cpu_tier_catches_gpu_evictions_and_reports_them() {
    let mut pool = BlockPool::new(2, 4, 0).with_cpu_tier(1);
    let extra = ExtraKeys::default();
    let a = tokens(8, 0);
    let (blocks_a, _) = admit(&mut pool, &a, &extra);
    pool.free(&blocks_a);
    let a_hashes = pool.hash_blocks(&a, &extra);
    pool.take_events();
    // Two new blocks evict both of a's: the tail first (to CPU), then the head, which
    // pushes the tail out of the one-block CPU tier.
    let (_blocks_b, _) = admit(&mut pool, &tokens(8, 500), &extra);
    let events = pool.take_events();
    let cpu_stored: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            KvEvent::Stored {
                hashes,
                medium: Medium::Cpu,
                token_ids,
                parent,
                ..
            } => Some((hashes[0], token_ids.clone(), *parent)),
            _ => None,
        })
        .collect();
    assert_eq!(cpu_stored.len(), 2);
    assert_eq!(
        cpu_stored[0],
        (a_hashes[1], a[4..8].to_vec(), Some(a_hashes[0]))
    );
    assert_eq!(cpu_stored[1], (a_hashes[0], a[0..4].to_vec(), None));
    assert!(events.contains(&KvEvent::Removed {
        hashes: vec![a_hashes[1]],
        medium: Medium::Cpu
    }));
    assert_eq!(pool.cpu_hashes(), vec![a_hashes[0]]);
    assert_eq!(pool.cpu_prefix_len(&a_hashes), 1);
    pool.take_from_cpu(&a_hashes[..1]);
    assert!(pool.cpu_hashes().is_empty());
}
