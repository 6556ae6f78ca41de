//! KV event batches as the subscriber decodes them (`kv_index::wire::decode_batch`), both wire
//! eras. Properties: only a whole msgpack value is accepted (rmpv reads exactly the same
//! bytes), and an accepted batch re-encoded in either era decodes to the same batch.

#![no_main]

use libfuzzer_sys::fuzz_target;
use warmpath_agent::kv_index::wire::{Batch, Event, decode_batch};

use warmpath_fuzz::kv_encode as encode;

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = decode_batch(data) else {
        return;
    };
    let mut rest = data;
    let value = rmpv::decode::read_value_with_max_depth(&mut rest, 1 << 20);
    assert!(
        value.is_ok() && rest.is_empty(),
        "accepted a payload that is not exactly one msgpack value: {value:?}, {} bytes left",
        rest.len()
    );
    for era in [encode::Era::Array, encode::Era::Map] {
        let wire = encode::batch(era, &batch);
        let again = decode_batch(&wire)
            .unwrap_or_else(|e| panic!("{era:?} re-encoding of {batch:?} does not decode: {e}"));
        assert_same(&batch, &again, era);
    }
});

fn assert_same(a: &Batch, b: &Batch, era: encode::Era) {
    assert_eq!(a.ts.to_bits(), b.ts.to_bits(), "{era:?}: ts");
    assert_eq!(a.dp_rank, b.dp_rank, "{era:?}: dp_rank");
    assert_eq!(a.events.len(), b.events.len(), "{era:?}: event count");
    for (x, y) in a.events.iter().zip(&b.events) {
        match (x, y) {
            (Event::Unknown, Event::Unknown) | (Event::AllCleared, Event::AllCleared) => {}
            _ => assert_eq!(x, y, "{era:?}: event"),
        }
    }
}
