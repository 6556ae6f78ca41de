//! Decoding vLLM KV event batches: both wire eras, lenient.
//!
//! Accepts the batch as a positional array `[ts, events, dp_rank]` or a map; each event as a
//! tagged array (`["BlockStored", ...]`, array era, any number of trailing fields) or a map
//! with `type` (map era, unknown keys ignored); hashes as unsigned or signed ints or as byte
//! strings. See ../shared/reference/vllm-interfaces.md.

use super::{
    Tier,
    msgpack::{Error as MsgError, Reader},
};

/// An engine's block hash reduced to 64 bits: ints as their bits, byte strings by their last
/// eight bytes big-endian (vLLM's own int form of a digest), shorter ones zero-extended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineHash(pub u64);

/// One stored run of blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub hashes: Vec<EngineHash>,
    pub parent: Option<EngineHash>,
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_name: Option<String>,
    pub tier: Tier,
    /// Per block: the engine's extra keys as strings, or None.
    pub extra_keys: Vec<Option<Vec<String>>>,
    /// False for KV groups that are not full attention (sliding window, mamba, ...).
    pub reusable: bool,
}

/// Blocks evicted from one tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub hashes: Vec<EngineHash>,
    pub tier: Tier,
    pub reusable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Stored(Stored),
    Removed(Removed),
    AllCleared,
    /// A tag this version does not know; skipped, counted.
    Unknown,
}

/// One published batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub ts: f64,
    pub events: Vec<Event>,
    pub dp_rank: Option<u64>,
}

/// Why a payload was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("malformed msgpack: {0}")]
    Msgpack(#[from] MsgError),
    #[error("{0}")]
    Shape(&'static str),
    #[error("{count} bytes after the batch")]
    Trailing { count: usize },
}

/// Decodes one batch payload.
pub fn decode_batch(payload: &[u8]) -> Result<Batch, WireError> {
    let mut r = Reader::new(payload);
    let batch = if r.at_map() {
        batch_map(&mut r)?
    } else {
        batch_array(&mut r)?
    };
    if r.remaining() > 0 {
        return Err(WireError::Trailing {
            count: r.remaining(),
        });
    }
    Ok(batch)
}

fn batch_array(r: &mut Reader<'_>) -> Result<Batch, WireError> {
    let n = r.array_len()?;
    if n < 2 {
        return Err(WireError::Shape("batch array needs [ts, events, ...]"));
    }
    let ts = r.float()?;
    let events = events(r)?;
    let dp_rank = if n >= 3 { opt_int(r)? } else { None };
    for _ in 3..n {
        r.skip()?;
    }
    Ok(Batch {
        ts,
        events,
        dp_rank,
    })
}

fn batch_map(r: &mut Reader<'_>) -> Result<Batch, WireError> {
    let mut batch = Batch {
        ts: 0.0,
        events: Vec::new(),
        dp_rank: None,
    };
    for _ in 0..r.map_len()? {
        match r.str()? {
            "ts" => batch.ts = r.float()?,
            "events" => batch.events = events(r)?,
            "data_parallel_rank" => batch.dp_rank = opt_int(r)?,
            _ => {
                r.skip()?;
            }
        }
    }
    Ok(batch)
}

fn events(r: &mut Reader<'_>) -> Result<Vec<Event>, WireError> {
    let n = r.array_len()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(if r.at_map() {
            event_map(r)?
        } else {
            event_array(r)?
        });
    }
    Ok(out)
}

/// Fields common to both forms, filled in any order.
#[derive(Default)]
struct Fields {
    hashes: Vec<EngineHash>,
    parent: Option<EngineHash>,
    token_ids: Vec<u32>,
    block_size: u32,
    lora_name: Option<String>,
    tier: Option<Tier>,
    extra_keys: Vec<Option<Vec<String>>>,
    group_idx: Option<u64>,
    kind: Option<String>,
}

impl Fields {
    fn reusable(&self) -> bool {
        match &self.kind {
            Some(kind) => kind == "full_attention",
            None => self.group_idx.is_none_or(|g| g == 0),
        }
    }

    fn into_event(self, tag: &str) -> Event {
        let reusable = self.reusable();
        match tag {
            "BlockStored" => Event::Stored(Stored {
                hashes: self.hashes,
                parent: self.parent,
                token_ids: self.token_ids,
                block_size: self.block_size,
                lora_name: self.lora_name,
                tier: self.tier.unwrap_or(Tier::Gpu),
                extra_keys: self.extra_keys,
                reusable,
            }),
            "BlockRemoved" => Event::Removed(Removed {
                hashes: self.hashes,
                tier: self.tier.unwrap_or(Tier::Gpu),
                reusable,
            }),
            "AllBlocksCleared" => Event::AllCleared,
            _ => Event::Unknown,
        }
    }
}

/// Positional field names per tag (array era), after the tag itself.
const STORED_FIELDS: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
];
const REMOVED_FIELDS: &[&str] = &["block_hashes", "medium", "group_idx"];

fn event_array(r: &mut Reader<'_>) -> Result<Event, WireError> {
    let n = r.array_len()?;
    if n == 0 {
        return Err(WireError::Shape("empty event array"));
    }
    let tag = r.str()?;
    let names: &[&str] = match tag {
        "BlockStored" => STORED_FIELDS,
        "BlockRemoved" => REMOVED_FIELDS,
        _ => &[],
    };
    let mut f = Fields::default();
    for i in 1..n {
        match names.get(i - 1) {
            Some(name) => field(r, &mut f, name.as_bytes())?,
            None => {
                r.skip()?;
            }
        }
    }
    Ok(f.into_event(tag))
}

fn event_map(r: &mut Reader<'_>) -> Result<Event, WireError> {
    let mut f = Fields::default();
    let mut tag = None;
    for _ in 0..r.map_len()? {
        // Keys compared as bytes: no UTF-8 validation per key (unknown keys are skipped).
        let key = r.bytes()?;
        if key == b"type" {
            tag = Some(r.str()?);
        } else {
            field(r, &mut f, key)?;
        }
    }
    let tag = tag.ok_or(WireError::Shape("event map without `type`"))?;
    Ok(f.into_event(tag))
}

fn field(r: &mut Reader<'_>, f: &mut Fields, name: &[u8]) -> Result<(), WireError> {
    match name {
        b"block_hashes" => {
            let n = r.array_len()?;
            f.hashes.reserve(n);
            for _ in 0..n {
                f.hashes.push(hash(r)?);
            }
        }
        b"parent_block_hash" => f.parent = if r.nil()? { None } else { Some(hash(r)?) },
        b"token_ids" => r.u32_array(&mut f.token_ids)?,
        b"block_size" => {
            f.block_size =
                u32::try_from(r.int()?).map_err(|_| WireError::Shape("block_size exceeds u32"))?
        }
        b"medium" => {
            f.tier = if r.nil()? {
                None
            } else {
                Some(Tier::from_medium(r.str()?))
            }
        }
        b"lora_name" => {
            f.lora_name = if r.nil()? {
                None
            } else {
                Some(r.str()?.to_string())
            }
        }
        b"extra_keys" => f.extra_keys = extra_keys(r)?,
        b"group_idx" => f.group_idx = opt_int(r)?,
        b"kv_cache_spec_kind" => {
            f.kind = if r.nil()? {
                None
            } else {
                Some(r.str()?.to_string())
            }
        }
        _ => {
            r.skip()?;
        }
    }
    Ok(())
}

fn hash(r: &mut Reader<'_>) -> Result<EngineHash, WireError> {
    if r.at_bin() || r.at_str() {
        let b = r.bytes()?;
        let tail = &b[b.len().saturating_sub(8)..];
        return Ok(EngineHash(
            tail.iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x)),
        ));
    }
    Ok(EngineHash(r.int()?))
}

fn opt_int(r: &mut Reader<'_>) -> Result<Option<u64>, WireError> {
    Ok(if r.nil()? { None } else { Some(r.int()?) })
}

/// `list[tuple | None] | None`; tuple items become strings (ints in decimal, other values as
/// the hex of their encoding) so router keys can include them.
fn extra_keys(r: &mut Reader<'_>) -> Result<Vec<Option<Vec<String>>>, WireError> {
    if r.nil()? {
        return Ok(Vec::new());
    }
    let n = r.array_len()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if r.nil()? {
            out.push(None);
            continue;
        }
        let m = r.array_len()?;
        let mut items = Vec::with_capacity(m);
        for _ in 0..m {
            items.push(if r.at_str() {
                r.str()?.to_string()
            } else if let Ok(v) = r.clone().int() {
                r.int()?;
                (v as i64).to_string()
            } else {
                hex::encode(r.skip()?)
            });
        }
        out.push(Some(items));
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod test_encoder;
#[cfg(test)]
mod tests;
