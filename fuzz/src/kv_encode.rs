//! A KV event batch written back to msgpack as vLLM's structs would carry it, in either era
//! (the agent's own encoder is test-only).

use warmpath_agent::kv_index::wire::{Batch, EngineHash, Event};

/// Which of vLLM's two event layouts to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    Array,
    Map,
}

const VEC: &str = "writing to a Vec cannot fail";

pub fn batch(era: Era, b: &Batch) -> Vec<u8> {
    let mut out = Vec::new();
    let o = &mut out;
    match era {
        Era::Array => {
            rmp::encode::write_array_len(o, 3).expect(VEC);
            rmp::encode::write_f64(o, b.ts).expect(VEC);
            events(o, era, &b.events);
            opt_uint(o, b.dp_rank);
        }
        Era::Map => {
            rmp::encode::write_map_len(o, 3).expect(VEC);
            rmp::encode::write_str(o, "ts").expect(VEC);
            rmp::encode::write_f64(o, b.ts).expect(VEC);
            rmp::encode::write_str(o, "events").expect(VEC);
            events(o, era, &b.events);
            rmp::encode::write_str(o, "data_parallel_rank").expect(VEC);
            opt_uint(o, b.dp_rank);
        }
    }
    out
}

fn events(o: &mut Vec<u8>, era: Era, events: &[Event]) {
    rmp::encode::write_array_len(o, events.len() as u32).expect(VEC);
    for e in events {
        event(o, era, e);
    }
}

/// Fields as (name, writer); the array era writes them positionally.
fn event(o: &mut Vec<u8>, era: Era, e: &Event) {
    type Field<'a> = (&'static str, Box<dyn Fn(&mut Vec<u8>) + 'a>);
    let (tag, fields): (&str, Vec<Field<'_>>) = match e {
        Event::Stored(s) => (
            "BlockStored",
            vec![
                (
                    "block_hashes",
                    Box::new(|o: &mut Vec<u8>| hashes(o, &s.hashes)),
                ),
                (
                    "parent_block_hash",
                    Box::new(|o: &mut Vec<u8>| match s.parent {
                        Some(h) => rmp::encode::write_uint(o, h.0).map(drop).expect(VEC),
                        None => rmp::encode::write_nil(o).expect(VEC),
                    }),
                ),
                (
                    "token_ids",
                    Box::new(|o: &mut Vec<u8>| {
                        rmp::encode::write_array_len(o, s.token_ids.len() as u32).expect(VEC);
                        for t in &s.token_ids {
                            rmp::encode::write_uint(o, u64::from(*t)).expect(VEC);
                        }
                    }),
                ),
                (
                    "block_size",
                    Box::new(|o: &mut Vec<u8>| {
                        rmp::encode::write_uint(o, u64::from(s.block_size))
                            .map(drop)
                            .expect(VEC)
                    }),
                ),
                (
                    "lora_id",
                    Box::new(|o: &mut Vec<u8>| rmp::encode::write_nil(o).expect(VEC)),
                ),
                (
                    "medium",
                    Box::new(|o: &mut Vec<u8>| {
                        rmp::encode::write_str(o, s.tier.as_str()).expect(VEC)
                    }),
                ),
                (
                    "lora_name",
                    Box::new(|o: &mut Vec<u8>| opt_str(o, s.lora_name.as_deref())),
                ),
                (
                    "extra_keys",
                    Box::new(|o: &mut Vec<u8>| {
                        rmp::encode::write_array_len(o, s.extra_keys.len() as u32).expect(VEC);
                        for block in &s.extra_keys {
                            match block {
                                None => rmp::encode::write_nil(o).expect(VEC),
                                Some(items) => {
                                    rmp::encode::write_array_len(o, items.len() as u32).expect(VEC);
                                    for item in items {
                                        rmp::encode::write_str(o, item).expect(VEC);
                                    }
                                }
                            }
                        }
                    }),
                ),
                (
                    "group_idx",
                    Box::new(|o: &mut Vec<u8>| rmp::encode::write_nil(o).expect(VEC)),
                ),
                (
                    "kv_cache_spec_kind",
                    Box::new(|o: &mut Vec<u8>| {
                        let kind = if s.reusable {
                            "full_attention"
                        } else {
                            "sliding_window"
                        };
                        rmp::encode::write_str(o, kind).expect(VEC)
                    }),
                ),
            ],
        ),
        Event::Removed(r) => (
            "BlockRemoved",
            vec![
                (
                    "block_hashes",
                    Box::new(|o: &mut Vec<u8>| hashes(o, &r.hashes)),
                ),
                (
                    "medium",
                    Box::new(|o: &mut Vec<u8>| {
                        rmp::encode::write_str(o, r.tier.as_str()).expect(VEC)
                    }),
                ),
                (
                    "group_idx",
                    Box::new(|o: &mut Vec<u8>| {
                        rmp::encode::write_uint(o, u64::from(!r.reusable))
                            .map(drop)
                            .expect(VEC)
                    }),
                ),
            ],
        ),
        Event::AllCleared => ("AllBlocksCleared", Vec::new()),
        Event::Unknown => ("SomeFutureEvent", Vec::new()),
    };
    match era {
        Era::Array => {
            rmp::encode::write_array_len(o, 1 + fields.len() as u32).expect(VEC);
            rmp::encode::write_str(o, tag).expect(VEC);
            for (_, write) in &fields {
                write(o);
            }
        }
        Era::Map => {
            rmp::encode::write_map_len(o, 1 + fields.len() as u32).expect(VEC);
            rmp::encode::write_str(o, "type").expect(VEC);
            rmp::encode::write_str(o, tag).expect(VEC);
            for (name, write) in &fields {
                rmp::encode::write_str(o, name).expect(VEC);
                write(o);
            }
        }
    }
}

fn hashes(o: &mut Vec<u8>, hashes: &[EngineHash]) {
    rmp::encode::write_array_len(o, hashes.len() as u32).expect(VEC);
    for h in hashes {
        rmp::encode::write_uint(o, h.0).expect(VEC);
    }
}

fn opt_uint(o: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => rmp::encode::write_uint(o, v).map(drop).expect(VEC),
        None => rmp::encode::write_nil(o).expect(VEC),
    }
}

fn opt_str(o: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(v) => rmp::encode::write_str(o, v).expect(VEC),
        None => rmp::encode::write_nil(o).expect(VEC),
    }
}
