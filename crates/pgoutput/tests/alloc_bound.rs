//! Hostile input never panics the decoders and never makes them allocate more than the
//! input could describe.
//!
//! The counting allocator is process-wide, so this binary holds exactly one `#[test]`
//! and runs its properties one after another: a second test thread would pollute the
//! counts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::alloc::System;

use bytes::{Bytes, BytesMut};
use common::{all_fixture_messages, message_with_state};
use pgoutput::*;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CASES: u32 = 1500;

/// Bytes allocated while `f` runs (fresh allocations plus net growth by realloc).
fn allocated_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let region = Region::new(GLOBAL);
    let out = f();
    let change = region.change();
    let grown = usize::try_from(change.bytes_reallocated.max(0)).unwrap();
    (out, change.bytes_allocated + grown)
}

fn budget(len: usize) -> usize {
    64 * len + 4096
}

/// Decodes `input` as a frame and as a message in both stream states, checking the
/// allocation bound for each; a panic anywhere fails the property.
fn check(input: &[u8]) -> Result<(), TestCaseError> {
    let limit = budget(input.len());
    let frame_input = Bytes::copy_from_slice(input);
    let (frame, used) = allocated_during(|| ReplicationFrame::decode(frame_input));
    prop_assert!(
        used <= limit,
        "frame decode of {} bytes allocated {used}",
        input.len()
    );
    if let Ok(ReplicationFrame::XLogData(x)) = frame {
        for state in [StreamState::Outside, StreamState::InsideStream] {
            let data = x.data.clone();
            let (_, used) = allocated_during(|| LogicalMessage::decode(data, state));
            prop_assert!(used <= limit, "nested message decode allocated {used}");
        }
    }
    for state in [StreamState::Outside, StreamState::InsideStream] {
        let data = Bytes::copy_from_slice(input);
        let (_, used) = allocated_during(|| LogicalMessage::decode(data, state));
        prop_assert!(
            used <= limit,
            "message decode ({state:?}) of {} bytes allocated {used}",
            input.len()
        );
    }
    let data = Bytes::copy_from_slice(input);
    let (_, used) = allocated_during(|| StandbyStatusUpdate::decode(data));
    prop_assert!(used <= limit);
    check_canonical(input)
}

/// The encodings are canonical: whatever a decoder accepts re-encodes to the same bytes,
/// so the decoders neither skip nor invent anything.
fn check_canonical(input: &[u8]) -> Result<(), TestCaseError> {
    let data = Bytes::copy_from_slice(input);
    if let Ok(frame) = ReplicationFrame::decode(data.clone()) {
        let mut buf = BytesMut::new();
        frame.encode(&mut buf);
        prop_assert_eq!(&buf[..], input);
    }
    for state in [StreamState::Outside, StreamState::InsideStream] {
        if let Ok(msg) = LogicalMessage::decode(data.clone(), state) {
            prop_assert_eq!(&msg.to_bytes()[..], input, "{:?}", msg);
        }
    }
    if let Ok(update) = StandbyStatusUpdate::decode(data) {
        prop_assert_eq!(&update.to_bytes()[..], input);
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Mutation {
    SetByte(Index, u8),
    /// Overwrites four bytes with a suspicious count or length.
    SetWord(Index, i32),
    /// Overwrites two bytes with a suspicious Int16 count.
    SetHalf(Index, i16),
    Insert(Index, u8),
    Remove(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let word = prop_oneof![
        Just(i32::MAX),
        Just(i32::MIN),
        Just(-1),
        Just(0x7fff),
        Just(0x0001_0000),
        any::<i32>(),
    ];
    let half = prop_oneof![
        Just(i16::MAX),
        Just(i16::MIN),
        Just(-1),
        Just(30_000),
        any::<i16>()
    ];
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::SetByte(i, b)),
        (any::<Index>(), word).prop_map(|(i, w)| Mutation::SetWord(i, w)),
        (any::<Index>(), half).prop_map(|(i, h)| Mutation::SetHalf(i, h)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<Index>().prop_map(Mutation::Remove),
    ]
}

fn overwrite(buf: &mut [u8], at: &Index, bytes: &[u8]) {
    if buf.is_empty() {
        return;
    }
    let start = at.index(buf.len());
    for (dst, src) in buf[start..].iter_mut().zip(bytes) {
        *dst = *src;
    }
}

fn apply(mut buf: Vec<u8>, mutations: &[Mutation], truncate_at: Option<Index>) -> Vec<u8> {
    for m in mutations {
        match m {
            Mutation::SetByte(i, b) => overwrite(&mut buf, i, &[*b]),
            Mutation::SetWord(i, w) => overwrite(&mut buf, i, &w.to_be_bytes()),
            Mutation::SetHalf(i, h) => overwrite(&mut buf, i, &h.to_be_bytes()),
            Mutation::Insert(i, b) => {
                let at = i.index(buf.len() + 1);
                buf.insert(at, *b);
            }
            Mutation::Remove(i) => {
                if !buf.is_empty() {
                    buf.remove(i.index(buf.len()));
                }
            }
        }
    }
    if let Some(i) = truncate_at {
        buf.truncate(i.index(buf.len() + 1));
    }
    buf
}

/// Valid encodings to mutate: generated messages, bare and wrapped in XLogData, and the
/// captured fixtures.
fn seed(fixtures: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        message_with_state().prop_map(|(m, _)| m.to_bytes().to_vec()),
        message_with_state().prop_map(|(m, _)| {
            let mut buf = vec![b'w'];
            buf.extend_from_slice(&[0; 24]);
            buf.extend_from_slice(&m.to_bytes());
            buf
        }),
        prop::sample::select(fixtures),
    ]
}

fn run<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{name}: {e}");
    }
}

#[test]
fn decoders_never_panic_and_allocate_in_proportion_to_input() {
    // Fixed cases first, so an obvious regression fails with a readable input.
    let mut many_columns = vec![b'R', 0, 0, 0x40, 0x0a, b'p', 0, b't', 0, b'd'];
    many_columns.extend_from_slice(&30_000i16.to_be_bytes());
    many_columns.extend_from_slice(&[1, b'a', 0, 0, 0, 0, 23, 0xff, 0xff, 0xff]);
    let fixed: [&[u8]; 6] = [
        &many_columns,
        b"T\x7f\xff\xff\xff\x00\x00\x00\x00\x01",
        b"I\x00\x00\x40\x0aN\x7f\xff",
        b"M\x01\x00\x00\x00\x00\x00\x00\x00\x01o\x00\x7f\xff\xff\xff",
        b"",
        b"w",
    ];
    for input in fixed {
        check(input).unwrap();
    }

    run("arbitrary bytes", vec(any::<u8>(), 0..256), |input| {
        check(&input)
    });
    run(
        "arbitrary bytes behind a valid tag",
        (
            prop::sample::select(b"wkrBCORYIUDTMSEcAbPKrp".to_vec()),
            vec(any::<u8>(), 0..128),
        ),
        |(tag, rest)| {
            let mut input = vec![tag];
            input.extend_from_slice(&rest);
            check(&input)
        },
    );

    let fixtures: Vec<Vec<u8>> = all_fixture_messages()
        .into_iter()
        .map(|(b, _)| b.to_vec())
        .collect();
    run(
        "mutated and truncated valid encodings",
        (
            seed(fixtures),
            vec(mutation(), 0..4),
            proptest::option::of(any::<Index>()),
        ),
        |(seed, mutations, truncate_at)| check(&apply(seed, &mutations, truncate_at)),
    );
}
