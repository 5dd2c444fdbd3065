//! Generated messages to every RPC of a running allotd and of a real agent (issue
//! 11): strings empty, at their caps, huge (100 KB), with NUL, newlines, escapes and
//! unicode; numbers at their extremes (NaN and infinities for doubles); long
//! repeated fields; missing sub-messages; streams of arbitrary agent messages with
//! an arbitrary first one; raw bytes that are no message at all. Each is sent as an
//! admin (token), as a plain user (token), as a node (certificate), as a user a node
//! vouches for, with a forged token, anonymously, and (for the user commands)
//! through the agent's socket, which forwards to allotd.
//!
//! For every call: it returns within [`BOUND`]; a refusal has a known code and a
//! message that is one line of readable text of at most [`MAX_MESSAGE`] bytes. Never
//! UNKNOWN or INTERNAL (bytes that are no message are INVALID_ARGUMENT, the sender's
//! mistake), but for one answer given before any handler runs: HTTP/2's status 431
//! to headers over allotd's 64 KiB, which a gRPC client reads as UNKNOWN. After each RPC's cases allotd and the agents still run and answer a
//! plain request; at the end neither log holds a panic.
//!
//! Cases per RPC: 64, or `PROPTEST_CASES`; each RPC's line counts its answers by
//! code, and `ALLOT_FUZZ_SHOW=1` prints every refusal. The generated work runs only
//! `true`, `sleep` and paths under `/nonexistent/`; adopted pids lie above any
//! pid_max; hooks run nothing that exists. Node 0 is the identity the cases speak
//! as and is never revoked or re-enrolled; node 1 is the one renewals and
//! revocations may hit.

mod support;

use allot_proto::v1 as pb;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};
use support::Cluster;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

/// Longest any one call (or a stream's first message) may take.
const BOUND: Duration = Duration::from_secs(10);
/// Longest a refusal's message may be: it travels in a header and is read by people;
/// a service that echoes a 100 KB field back fails here.
const MAX_MESSAGE: usize = 8 * 1024;
/// Cases per RPC unless `PROPTEST_CASES` says otherwise.
const CASES: u32 = 64;

// ------------------------------------------------------------------ generators

/// Names the cluster knows and near misses (never node-0: see the file's doc).
const NAMES: &[&str] = &[
    "p-a",
    "p-b",
    "team-a",
    "node-1",
    "root",
    "allot-test-a",
    "batch",
    "training",
    "default",
    "health",
    "cluster-operator",
    "A-1",
    "1",
    "0",
    "-1",
    " 1 ",
    "18446744073709551615",
    "18446744073709551616",
    "..",
    ".",
    "-",
    "@",
    "a b",
    "ünï",
    "%s%n",
    "${HOME}",
    "'",
    "\"",
    "\\",
    "Bearer ",
];

/// Lengths either side of every cap (names 128, reasons 1 KiB, hooks and arguments
/// 4 KiB, CSRs 16 KiB, command lines and header lists 64 KiB).
const CAPS: &[usize] = &[
    31, 32, 33, 127, 128, 129, 1023, 1024, 1025, 4095, 4096, 4097, 16384, 16385, 65536, 65537,
];

fn text() -> BoxedStrategy<String> {
    prop_oneof![
        2 => Just(String::new()),
        4 => prop::sample::select(NAMES).prop_map(str::to_string),
        3 => "[a-z0-9._@-]{1,24}",
        3 => "\\PC{0,40}",
        3 => prop::collection::vec(any::<char>(), 0..40).prop_map(|v| v.into_iter().collect()),
        2 => "[a-z\\x00\\n\\r\\t\\x1b\\x7f\u{85}\u{202e}\u{feff}é漢🙂 ]{0,30}",
        1 => prop::sample::select(CAPS).prop_map(|n| "a".repeat(n)),
        1 => (0usize..=100_000, prop::sample::select(&['a', '\0', '\n', 'é', '🙂'][..]))
            .prop_map(|(n, c)| std::iter::repeat_n(c, n).collect()),
    ]
    .boxed()
}

/// Text far over every cap: where a service might echo it back.
fn huge() -> BoxedStrategy<String> {
    prop_oneof![
        prop::sample::select(CAPS).prop_map(|n| "a".repeat(n)),
        (
            8_192usize..=100_000,
            prop::sample::select(&['a', '\0', '\n', 'é', '🙂'][..])
        )
            .prop_map(|(n, c)| std::iter::repeat_n(c, n).collect()),
    ]
    .boxed()
}

/// A name or an id as a request gives it: any text, often huge.
fn name_text() -> BoxedStrategy<String> {
    prop_oneof![3 => text(), 1 => huge()].boxed()
}

/// Short text, for lists of many entries.
fn short() -> BoxedStrategy<String> {
    prop_oneof![Just(String::new()), "[a-z0-9-]{1,6}", "\\PC{0,4}"].boxed()
}

fn u32s() -> BoxedStrategy<u32> {
    prop_oneof![
        Just(0u32),
        Just(1),
        Just(u32::MAX),
        Just(u32::MAX - 1),
        Just(i32::MAX as u32),
        Just(64),
        Just(65),
        Just(4096),
        Just(4097),
        0u32..10,
        any::<u32>(),
    ]
    .boxed()
}

fn u64s() -> BoxedStrategy<u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(i64::MAX as u64),
        Just(i64::MAX as u64 + 1),
        Just(u64::MAX / 1000 + 1),
        Just(u32::MAX as u64 + 1),
        0u64..100,
        any::<u64>(),
    ]
    .boxed()
}

fn i64s() -> BoxedStrategy<i64> {
    prop_oneof![
        Just(0i64),
        Just(-1),
        Just(1),
        Just(i64::MIN),
        Just(i64::MAX),
        Just(i64::MIN + 1),
        Just(i64::MAX / 1000 + 1),
        Just(1_700_000_000),
        any::<i64>(),
    ]
    .boxed()
}

fn i32s() -> BoxedStrategy<i32> {
    prop_oneof![
        Just(0i32),
        Just(-1),
        Just(i32::MIN),
        Just(i32::MAX),
        -10i32..10,
        any::<i32>()
    ]
    .boxed()
}

fn f64s() -> BoxedStrategy<f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(-f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0),
        Just(-0.0),
        Just(f64::MIN_POSITIVE),
        Just(5e-324),
        Just(f64::MAX),
        Just(f64::MIN),
        Just(1.0),
        Just(1e-300),
        Just(1e300),
        Just(1e6),
        0.0f64..100.0,
        any::<f64>(),
    ]
    .boxed()
}

/// An enum field: its values, and numbers no version knows.
fn enums() -> BoxedStrategy<i32> {
    prop_oneof![3 => 0i32..9, 1 => Just(-1), 1 => Just(i32::MAX), 1 => Just(i32::MIN)].boxed()
}

fn opt<T: std::fmt::Debug + Clone + 'static>(s: BoxedStrategy<T>) -> BoxedStrategy<Option<T>> {
    prop::option::of(s).boxed()
}

/// A list: a few rich entries, or many cheap ones.
fn many<T: std::fmt::Debug + Clone + 'static>(
    rich: BoxedStrategy<T>,
    cheap: BoxedStrategy<T>,
    lots: usize,
) -> BoxedStrategy<Vec<T>> {
    prop_oneof![
        5 => prop::collection::vec(rich, 0..4),
        1 => prop::collection::vec(cheap, 0..lots),
    ]
    .boxed()
}

/// A command line whose first word runs nothing harmful: `true`, `sleep`, a path
/// under a directory that does not exist, or what is refused before it runs.
fn argv() -> BoxedStrategy<Vec<String>> {
    let first = prop_oneof![
        4 => Just("true".to_string()),
        1 => Just(String::new()),
        1 => Just("\0".to_string()),
        1 => Just("true\0rm".to_string()),
        2 => text().prop_map(|t| format!("/nonexistent/allot-fuzz/{t}")),
    ];
    prop_oneof![
        1 => Just(Vec::new()),
        1 => Just(vec!["sleep".to_string(), "5".to_string()]),
        6 => (first.clone(), prop::collection::vec(text(), 0..4))
            .prop_map(|(f, rest)| std::iter::once(f).chain(rest).collect()),
        1 => (first, prop::collection::vec("[a-z]{0,6}", 0..2000))
            .prop_map(|(f, rest)| std::iter::once(f).chain(rest).collect()),
    ]
    .boxed()
}

/// A checkpoint hook that runs nothing that exists and reaches nothing listening.
fn hook() -> BoxedStrategy<String> {
    prop_oneof![
        3 => Just(String::new()),
        3 => prop::sample::select(&[
            "signal:USR1", "signal:KILL", "signal:NOPE", "signal:", "exec:", "exec:'",
            "exec:/nonexistent/allot-fuzz-hook", "http:", "http://127.0.0.1:1/x",
            "https://203.0.113.1/x", "http://[::1]:1/",
        ][..]).prop_map(str::to_string),
        2 => text().prop_map(|t| format!("?{t}")),
        1 => text().prop_map(|t| format!("exec:/nonexistent/allot-fuzz/{t}")),
        1 => text().prop_map(|t| format!("http://127.0.0.1:1/{t}")),
        1 => prop::sample::select(CAPS).prop_map(|n| format!("exec:/nonexistent/{}", "a".repeat(n))),
    ]
    .boxed()
}

fn project() -> BoxedStrategy<String> {
    prop_oneof![3 => prop::sample::select(&["p-a", "p-b", "team-a"][..]).prop_map(str::to_string), 2 => text()].boxed()
}

fn small_or<T: std::fmt::Debug + Clone + 'static>(
    small: impl Strategy<Value = T> + 'static,
    any: BoxedStrategy<T>,
) -> BoxedStrategy<T> {
    prop_oneof![3 => small, 1 => any].boxed()
}

/// How far a message strays: anywhere, or near one allotd (or the agent) would
/// take, so that the checks deep inside and the paths that accept are reached too.
#[derive(Clone, Copy)]
enum Mode {
    Wild,
    Near,
}

/// A field: anything in `Wild` mode; in `Near` mode most often `valid`.
fn f<T: std::fmt::Debug + Clone + 'static>(
    mode: Mode,
    valid: impl Strategy<Value = T> + 'static,
    wild: BoxedStrategy<T>,
) -> BoxedStrategy<T> {
    match mode {
        Mode::Wild => wild,
        Mode::Near => prop_oneof![12 => valid, 1 => wild].boxed(),
    }
}

/// A message built in both modes.
fn modes<T: std::fmt::Debug + Clone + 'static>(
    build: impl Fn(Mode) -> BoxedStrategy<T>,
) -> BoxedStrategy<T> {
    prop_oneof![1 => build(Mode::Wild), 2 => build(Mode::Near)].boxed()
}

/// A field of a message of few fields: valid twice as often as anything.
fn either<T: std::fmt::Debug + Clone + 'static>(
    valid: impl Strategy<Value = T> + 'static,
    wild: BoxedStrategy<T>,
) -> BoxedStrategy<T> {
    prop_oneof![2 => valid, 1 => wild].boxed()
}

fn valid_argv() -> BoxedStrategy<Vec<String>> {
    prop_oneof![
        3 => Just(vec!["true".to_string()]),
        1 => Just(vec!["sleep".to_string(), "1".to_string()]),
    ]
    .boxed()
}

fn valid_hook() -> BoxedStrategy<String> {
    prop::sample::select(
        &[
            "",
            "signal:USR1",
            "exec:/nonexistent/allot-fuzz-hook",
            "http://127.0.0.1:1/x",
        ][..],
    )
    .prop_map(str::to_string)
    .boxed()
}

fn safe(s: &'static [&'static str]) -> BoxedStrategy<String> {
    prop::sample::select(s).prop_map(str::to_string).boxed()
}

fn spec() -> BoxedStrategy<pb::WorkloadSpec> {
    modes(|m| {
        (
            (
                f(m, safe(&["p-a", "p-b"]), project()),
                f(m, Just(String::new()), prop_oneof![3 => Just(String::new()), 1 => Just("root".to_string()), 2 => text()].boxed()),
                f(m, safe(&["", "batch", "debug", "interactive", "training"]), text()),
                f(m, 1u32..=2, u32s()),
                f(m, 1u32..=2, u32s()),
                f(m, 0u32..=2, u32s()),
                f(m, 0u32..=1, u32s()),
            ),
            (
                f(m, prop::option::of(0u64..3), opt(u64s())),
                f(m, prop::option::of(3u64..60), opt(u64s())),
                any::<bool>(),
                f(m, -5i32..5, i32s()),
                f(m, valid_argv(), argv()),
                f(m, valid_hook(), hook()),
                any::<bool>(),
            ),
            (
                f(m, safe(&["", "/tmp", "/"]), text()),
                f(
                    m,
                    prop_oneof![
                        Just(Vec::new()),
                        Just(vec![pb::EnvVar {
                            name: "A_1".into(),
                            value: "x y".into()
                        }])
                    ],
                    many(
                        (text(), text())
                            .prop_map(|(name, value)| pb::EnvVar { name, value })
                            .boxed(),
                        (short(), short())
                            .prop_map(|(name, value)| pb::EnvVar { name, value })
                            .boxed(),
                        2_000,
                    ),
                ),
                f(m, safe(&["", "out-%j-%n.log"]), text()),
                f(m, safe(&["", "err-%j-%r"]), text()),
            ),
            (
                f(m, safe(&["", "USR2", "SIGUSR1"]), text()),
                f(m, 0u64..120, u64s()),
                f(m, safe(&["", "train-7"]), text()),
            ),
        )
            .prop_map(
                |(
                    (project, user, class, gpus_per_node, nodes, cpu_per_node, mem_per_node_gb),
                    (min_runtime_s, time_limit_s, resumable, priority, argv, checkpoint_hook, no_requeue),
                    (cwd, env, output, error),
                    (warn_signal, warn_before_s, name),
                )| pb::WorkloadSpec {
                    project,
                    user,
                    class,
                    gpus_per_node,
                    nodes,
                    cpu_per_node,
                    mem_per_node_gb,
                    min_runtime_s,
                    time_limit_s,
                    resumable,
                    priority,
                    argv,
                    checkpoint_hook,
                    no_requeue,
                    cwd,
                    env,
                    output,
                    error,
                    warn_signal,
                    warn_before_s,
                    name,
                    ..Default::default()
                },
            )
            .boxed()
    })
}

fn start_lease() -> BoxedStrategy<pb::StartLeaseRequest> {
    // Adopted pids lie above any pid_max (2^22): nothing real is ever adopted.
    let adopt = prop_oneof![1 => 4_194_305u32..=u32::MAX, 1 => Just(u32::MAX)].boxed();
    modes(move |m| {
        (
            (
                f(m, 1u32..=2, u32s()),
                f(m, 0u64..3, u64s()),
                f(m, prop::option::of(1u64..10), opt(u64s())),
                f(m, valid_hook(), hook()),
                f(m, 0u64..3, u64s()),
            ),
            (
                f(m, valid_argv(), argv()),
                f(
                    m,
                    safe(&["", "root"]),
                    prop_oneof![1 => Just("allot-test-a".to_string()), 2 => text()].boxed(),
                ),
                f(m, Just(0u32), adopt.clone()),
                f(m, "[a-z0-9-]{0,10}", text()),
            ),
            (f(m, safe(&["", "USR2"]), text()), f(m, 0u64..5, u64s())),
        )
            .prop_map(
                |(
                    (gpus, min_runtime_s, time_limit_s, checkpoint_hook, grace_s),
                    (argv, user, adopt_pid, workload_id),
                    (warn_signal, warn_before_s),
                )| {
                    pb::StartLeaseRequest {
                        gpus,
                        min_runtime_s,
                        time_limit_s,
                        checkpoint_hook,
                        grace_s,
                        argv,
                        user,
                        adopt_pid,
                        workload_id,
                        cwd: String::new(),
                        warn_signal,
                        warn_before_s,
                    }
                },
            )
            .boxed()
    })
}

/// A workload id as typed: often one that exists.
fn workload_id() -> BoxedStrategy<String> {
    prop_oneof![
        3 => (1u64..80).prop_map(|n| n.to_string()),
        1 => prop::sample::select(&["0", "-1", "18446744073709551615", "18446744073709551616",
            " 7 ", "+7", "07", "7.0", "0x7", "1e3", "٣"][..]).prop_map(str::to_string),
        3 => name_text(),
    ]
    .boxed()
}

fn lease_id() -> BoxedStrategy<String> {
    prop_oneof![2 => u64s().prop_map(|n| format!("A-{n}")), 1 => (0u64..40).prop_map(|n| format!("A-{n}")), 2 => text()].boxed()
}

fn reason() -> BoxedStrategy<pb::HealthReason> {
    (
        text(),
        text(),
        prop_oneof![
            Just(String::new()),
            Just("drain".to_string()),
            Just("drain-now".to_string()),
            text()
        ],
        any::<bool>(),
        i64s(),
    )
        .prop_map(
            |(signal, detail, action, gpu_only, since_unix)| pb::HealthReason {
                signal,
                detail,
                action,
                gpu_only,
                since_unix,
            },
        )
        .boxed()
}

fn gpu() -> BoxedStrategy<pb::Gpu> {
    (
        prop_oneof![2 => (0u32..8).prop_map(|i| format!("GPU-fz-{i}")), 1 => text()],
        small_or(0u32..8, u32s()),
        text(),
        text(),
        enums(),
        many(reason(), Just(pb::HealthReason::default()).boxed(), 200),
        prop_oneof![2 => Just(String::new()), 1 => lease_id()],
    )
        .prop_map(
            |(uuid, index, pci, model, state, reasons, lease_id)| pb::Gpu {
                uuid,
                index,
                pci,
                model,
                state,
                reasons,
                lease_id,
            },
        )
        .boxed()
}

/// GPUs a host could have.
fn valid_gpus() -> BoxedStrategy<Vec<pb::Gpu>> {
    (1u32..5, 0i32..4)
        .prop_map(|(n, state)| {
            (0..n)
                .map(|i| pb::Gpu {
                    uuid: format!("GPU-fz-{i}"),
                    index: i,
                    pci: format!("00000000:{:02X}:00.0", 0x18 + i),
                    model: "Fuzz GPU".into(),
                    state: if i == 0 {
                        state
                    } else {
                        pb::GpuState::Healthy as i32
                    },
                    ..Default::default()
                })
                .collect::<Vec<_>>()
        })
        .boxed()
}

/// GPUs, anything.
fn gpus() -> BoxedStrategy<Vec<pb::Gpu>> {
    let cheap = (0u32..200, short()).prop_map(|(index, uuid)| pb::Gpu {
        uuid,
        index,
        ..Default::default()
    });
    prop_oneof![
        1 => valid_gpus(),
        3 => prop::collection::vec(gpu(), 0..5),
        1 => prop::collection::vec(cheap, 0..200),
    ]
    .boxed()
}

fn drain_info() -> BoxedStrategy<pb::DrainInfo> {
    (
        prop_oneof![
            2 => prop::sample::select(&["health", "local-operator", "cluster-operator", "lost"][..]).prop_map(str::to_string),
            1 => text(),
        ],
        text(),
        text(),
        any::<bool>(),
        i64s(),
        any::<bool>(),
    )
        .prop_map(|(by, author, reason, now, since_unix, held)| pb::DrainInfo {
            by,
            author,
            reason,
            now,
            since_unix,
            held,
        })
        .boxed()
}

fn drains() -> BoxedStrategy<Vec<pb::DrainInfo>> {
    many(drain_info(), Just(pb::DrainInfo::default()).boxed(), 40)
}

fn lease() -> BoxedStrategy<pb::Lease> {
    modes(|m| {
        let d = |v| f(m, Just(v), text());
        (
            (
                f(m, (0u64..40).prop_map(|n| format!("A-{n}")), lease_id()),
                d(String::new()),
                f(m, Just(Vec::new()), many(text(), short(), 100)),
                f(m, Just(0), i64s()),
                f(m, Just(0), u64s()),
                f(m, Just(None), opt(u64s())),
                f(m, Just(String::new()), hook()),
                f(m, Just(0), u64s()),
                f(m, Just(pb::LeaseState::Ended as i32), enums()),
                f(m, Just(0), i64s()),
                d(String::new()),
            ),
            (
                f(
                    m,
                    Just(Vec::new()),
                    many(
                        (text(), u64s(), text())
                            .prop_map(|(rung, took_ms, note)| pb::LeaseStep {
                                rung,
                                took_ms,
                                note,
                            })
                            .boxed(),
                        Just(pb::LeaseStep::default()).boxed(),
                        500,
                    ),
                ),
                f(m, Just(0), u32s()),
                f(m, Just(0), i64s()),
                f(m, Just(0.0), f64s()),
                f(m, Just(0), u64s()),
                d(String::new()),
                f(
                    m,
                    safe(&[
                        "exited",
                        "revoked",
                        "time-limit",
                        "gpu-lost",
                        "vanished",
                        "refused",
                    ]),
                    text(),
                ),
                f(m, prop::option::of(0i32..3), opt(i32s())),
                f(m, Just(0), i64s()),
                d(String::new()),
                any::<bool>(),
                f(m, 0i32..8, enums()),
            ),
            (
                d(String::new()),
                d(String::new()),
                f(m, prop::option::of(1i32..32), opt(i32s())),
                f(m, Just(0i64), i64s()),
                f(m, 0u32..=100, any::<u32>().boxed()),
            ),
        )
            .prop_map(
                |(
                    (
                        id,
                        workload_id,
                        gpu_uuids,
                        start_unix,
                        min_runtime_s,
                        time_limit_s,
                        checkpoint_hook,
                        grace_s,
                        state,
                        not_before_unix,
                        ended_by,
                    ),
                    (
                        steps,
                        pid,
                        start_unix_ms,
                        cpu_pct,
                        rss_bytes,
                        user,
                        end_reason,
                        exit_code,
                        ended_unix,
                        revoke_why,
                        adopted,
                        end,
                    ),
                    (cgroup, end_detail, term_signal, idle_since_unix, gpu_util_pct),
                )| pb::Lease {
                    id,
                    workload_id,
                    gpu_uuids,
                    start_unix,
                    min_runtime_s,
                    time_limit_s,
                    checkpoint_hook,
                    grace_s,
                    state,
                    not_before_unix,
                    ended_by,
                    steps,
                    pid,
                    start_unix_ms,
                    cpu_pct,
                    rss_bytes,
                    user,
                    end_reason,
                    exit_code,
                    ended_unix,
                    revoke_why,
                    adopted,
                    end,
                    cgroup,
                    end_detail,
                    term_signal,
                    idle_since_unix,
                    gpu_util_pct,
                    // What an agent says of a lease's warning is not read back.
                    warn_signal: String::new(),
                    warn_before_s: 0,
                },
            )
            .boxed()
    })
}

fn valid_drains() -> BoxedStrategy<Vec<pb::DrainInfo>> {
    prop_oneof![
        3 => Just(Vec::new()),
        1 => (safe(&["health", "local-operator"]), any::<bool>(), any::<bool>()).prop_map(|(by, now, held)| {
            vec![pb::DrainInfo {
                by,
                author: "fuzz".into(),
                reason: "a generated drain".into(),
                now,
                held,
                ..Default::default()
            }]
        }),
    ]
    .boxed()
}

fn register() -> BoxedStrategy<pb::Register> {
    let labels = prop_oneof![
        4 => prop::collection::hash_map(text(), text(), 0..4),
        1 => prop::collection::hash_map("[a-z0-9]{1,8}", short(), 0..200),
    ]
    .boxed();
    let running = many(
        lease(),
        lease_id()
            .prop_map(|id| pb::Lease {
                id,
                ..Default::default()
            })
            .boxed(),
        5000,
    );
    modes(move |m| {
        (
            f(
                m,
                Just("node-0".to_string()),
                prop_oneof![3 => Just("node-0".to_string()), 1 => text()].boxed(),
            ),
            f(m, Just("test".to_string()), text()),
            f(
                m,
                prop::collection::hash_map("[a-z]{1,8}", "[a-z0-9]{0,8}", 0..3),
                labels.clone(),
            ),
            f(m, 0u32..64, u32s()),
            f(m, 0u64..512, u64s()),
            f(m, valid_gpus(), gpus()),
            f(
                m,
                prop::collection::vec(
                    (0u64..40).prop_map(|n| pb::Lease {
                        id: format!("A-{n}"),
                        ..Default::default()
                    }),
                    0..3,
                ),
                running.clone(),
            ),
            f(m, valid_drains(), drains()),
            f(m, 0u32..=2, u32s()),
        )
            .prop_map(
                |(host, cluster, labels, cpu, memory_gb, gpus, running, drains, protocol)| {
                    pb::Register {
                        host,
                        cluster: cluster.clone(),
                        labels: labels.clone(),
                        cpu,
                        memory_gb,
                        gpus,
                        running,
                        drains,
                        protocol,
                        advertise_addr: String::new(),
                        // Ids a host holds: anything, from one not yet given to absurd.
                        highest_workload: u64::from(protocol) * 1000,
                        highest_lease: u64::from(cpu),
                        // A type and features from the cluster's name: fuzzed text too.
                        gpu_type: cluster.chars().take(8).collect(),
                        features: labels.keys().take(3).cloned().collect(),
                        // Any fence, absurd ones too.
                        fence_s: memory_gb.rotate_left(17),
                    }
                },
            )
            .boxed()
    })
}

fn health_report() -> BoxedStrategy<pb::HealthReport> {
    modes(|m| {
        (
            f(m, 0i32..4, enums()),
            f(m, Just(Vec::new()), many(text(), short(), 200)),
            f(m, valid_gpus(), gpus()),
            f(m, valid_drains(), drains()),
            f(m, Just(Vec::new()), many(reason(), reason(), 100)),
        )
            .prop_map(
                |(verdict, only_gpus, gpus, drains, host_reasons)| pb::HealthReport {
                    verdict,
                    only_gpus,
                    gpus,
                    drains,
                    host_reasons,
                },
            )
            .boxed()
    })
}

/// An answer to a log read nobody (or somebody) asked for: any id, data up to past
/// the 1 MiB a read may return, any error text.
fn log_chunk() -> BoxedStrategy<pb::LogChunk> {
    (
        small_or(0u64..8, u64s()),
        prop_oneof![
            4 => prop::collection::vec(any::<u8>(), 0..256),
            1 => Just(vec![b'x'; (1 << 20) + 1]),
        ],
        any::<bool>(),
        any::<bool>(),
        prop_oneof![2 => Just(String::new()), 1 => text()],
    )
        .prop_map(|(request_id, data, eof, lease_live, error)| pb::LogChunk {
            request_id,
            data,
            eof,
            lease_live,
            error,
        })
        .boxed()
}

fn agent_message() -> BoxedStrategy<pb::AgentMessage> {
    use pb::agent_message::Body;
    prop_oneof![
        1 => Just(None),
        2 => register().prop_map(|r| Some(Body::Register(r))),
        4 => health_report().prop_map(|h| Some(Body::Health(h))),
        4 => opt(lease()).prop_map(|lease| Some(Body::LeaseStatus(pb::LeaseStatus { lease }))),
        2 => log_chunk().prop_map(|c| Some(Body::LogChunk(c))),
    ]
    .prop_map(|body| pb::AgentMessage { body })
    .boxed()
}

/// A session's messages: none, or a first (most often a registration) and more.
fn session_messages() -> BoxedStrategy<Vec<pb::AgentMessage>> {
    let first = prop_oneof![
        3 => register().prop_map(|r| pb::AgentMessage { body: Some(pb::agent_message::Body::Register(r)) }),
        1 => agent_message(),
    ];
    prop_oneof![
        1 => Just(Vec::new()),
        8 => (first, prop::collection::vec(agent_message(), 0..6))
            .prop_map(|(f, rest)| std::iter::once(f).chain(rest).collect()),
    ]
    .boxed()
}

/// Who asks.
#[derive(Debug, Clone)]
enum Caller {
    /// No certificate, no token.
    Anonymous,
    /// The admin's bearer token.
    Admin,
    /// A plain user's token: alice, member and manager of team-a (p-a), nothing
    /// of p-b.
    User,
    /// Node `i`'s certificate.
    Node(usize),
    /// Node 0's certificate and a user it vouches for (the header as given).
    Vouched(String),
    /// An `authorization` header that is not one of allotd's tokens.
    Forged(String),
    /// Through node 0's agent socket, which vouches for this process's user.
    ViaAgent,
}

/// A header value: printable ASCII (what a header may carry), of any length.
fn header_text() -> BoxedStrategy<String> {
    prop_oneof![
        2 => prop::sample::select(&["alice", "bob", "root"][..]).prop_map(str::to_string),
        3 => "[ -~]{0,60}",
        2 => prop::sample::select(NAMES).prop_map(str::to_string),
        1 => "Bearer [ -~]{0,60}",
        1 => "Bearer allot_[a-zA-Z0-9]{0,60}",
        1 => prop::sample::select(CAPS).prop_map(|n| format!("Bearer {}", "a".repeat(n))),
    ]
    .boxed()
}

/// Callers of allotd's services; `via_agent` adds the agent's socket.
fn caller(node: usize, via_agent: bool) -> BoxedStrategy<Caller> {
    let base = prop_oneof![
        3 => Just(Caller::Admin),
        2 => Just(Caller::User),
        2 => Just(Caller::Anonymous),
        2 => Just(Caller::Node(node)),
        1 => header_text().prop_map(Caller::Vouched),
        1 => header_text().prop_map(Caller::Forged),
    ];
    if via_agent {
        prop_oneof![5 => base, 2 => Just(Caller::ViaAgent)].boxed()
    } else {
        base.boxed()
    }
}

/// A secret that is text, or a fresh enrollment token (made at call time).
#[derive(Debug, Clone)]
enum Secret {
    Text(String),
    Fresh,
}

/// A signing request: text, a valid one for a name, or a valid one with a byte
/// changed.
#[derive(Debug, Clone)]
enum Csr {
    Text(String),
    Valid(String),
    Mangled(String, usize, u8),
}

fn csr() -> BoxedStrategy<Csr> {
    let name = prop_oneof![2 => "fz-[a-z0-9]{1,8}", 1 => text()];
    prop_oneof![
        3 => text().prop_map(Csr::Text),
        1 => text().prop_map(|t| Csr::Text(format!("-----BEGIN CERTIFICATE REQUEST-----\n{t}\n-----END CERTIFICATE REQUEST-----\n"))),
        2 => name.clone().prop_map(Csr::Valid),
        2 => (name, any::<usize>(), any::<u8>()).prop_map(|(n, i, b)| Csr::Mangled(n, i, b)),
    ]
    .boxed()
}

/// An id that is text, or one made for the case (a throwaway token or node).
#[derive(Debug, Clone)]
enum Pick {
    Text(String),
    Fresh,
}

fn pick() -> BoxedStrategy<Pick> {
    prop_oneof![3 => name_text().prop_map(Pick::Text), 1 => Just(Pick::Fresh)].boxed()
}

/// One call of one RPC.
#[allow(clippy::large_enum_variant)] // a test's cases, one at a time
#[derive(Debug, Clone)]
enum Case {
    Submit(Caller, pb::SubmitRequest),
    Cancel(Caller, pb::CancelRequest),
    Get(Caller, pb::GetRequest),
    List(Caller, pb::ListRequest),
    Watch(Caller, pb::WatchRequest),
    Logs(Caller, pb::LogsRequest),
    GetTree(Caller),
    SetWeight(Caller, pb::SetWeightRequest),
    ListNodes(Caller),
    Drain(Caller, pb::NodeDrainRequest),
    Session(Caller, Vec<pb::AgentMessage>),
    Enroll(Caller, Secret, Csr),
    Renew(Caller, Csr),
    CreateToken(Caller, pb::CreateTokenRequest),
    ListTokens(Caller),
    RevokeToken(Caller, Pick),
    EnrollNode(Caller, pb::EnrollNodeRequest),
    RevokeNode(Caller, Pick),
    RemoveNode(Caller, Pick),
    ListNodeCredentials(Caller),
    ListLeases,
    ListGpus,
    StartLease(pb::StartLeaseRequest),
    /// A lease id as text, or the n-th lease the agent lists.
    RevokeLease(Result<usize, String>, bool),
    LocalDrain(pb::DrainRequest),
    Undrain,
    Events(pb::EventsRequest),
    ClearGpu(pb::ClearGpuRequest),
    ReadLog(pb::ReadLogRequest),
    /// Bytes that may be no message at all, to a method by its path.
    Raw(bool, &'static str, Vec<u8>),
}

/// allotd's unary methods and the agent's, by path (for raw bytes).
const ALLOTD_PATHS: &[&str] = &[
    "/allot.v1.Workloads/Submit",
    "/allot.v1.Workloads/Cancel",
    "/allot.v1.Workloads/Get",
    "/allot.v1.Workloads/List",
    "/allot.v1.Org/GetTree",
    "/allot.v1.Org/SetWeight",
    "/allot.v1.Nodes/List",
    "/allot.v1.Nodes/Drain",
    "/allot.v1.Enrollment/Enroll",
    "/allot.v1.Enrollment/Renew",
    "/allot.v1.Admin/CreateToken",
    "/allot.v1.Admin/ListTokens",
    "/allot.v1.Admin/RevokeToken",
    "/allot.v1.Admin/EnrollNode",
    "/allot.v1.Admin/RevokeNode",
    "/allot.v1.Admin/RemoveNode",
    "/allot.v1.Admin/ListNodeCredentials",
];
const AGENT_PATHS: &[&str] = &[
    "/allot.v1.AgentLocal/ListLeases",
    "/allot.v1.AgentLocal/ListGpus",
    "/allot.v1.AgentLocal/StartLease",
    "/allot.v1.AgentLocal/RevokeLease",
    "/allot.v1.AgentLocal/Drain",
    "/allot.v1.AgentLocal/Undrain",
    "/allot.v1.AgentLocal/Events",
    "/allot.v1.AgentLocal/ClearGpu",
    "/allot.v1.AgentLocal/ReadLog",
    "/allot.v1.Workloads/Get",
    "/allot.v1.Nodes/Drain",
];

/// Bytes: random, or protobuf-shaped fields whose strings are not UTF-8.
fn raw_bytes() -> BoxedStrategy<Vec<u8>> {
    let field = (1u8..16, prop::collection::vec(any::<u8>(), 0..60)).prop_map(|(f, v)| {
        let mut out = vec![(f << 3) | 2, v.len() as u8];
        out.extend(v);
        out
    });
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..64),
        1 => prop::collection::vec(any::<u8>(), 0..8192),
        3 => prop::collection::vec(field, 1..4).prop_map(|v| v.concat()),
    ]
    .boxed()
}

/// Every family: the RPC's name and its cases.
fn families() -> Vec<(&'static str, BoxedStrategy<Case>)> {
    let c = || caller(0, true);
    let allotd_only = || caller(0, false);
    vec![
        // The agent's local API first, while allotd's state is plain.
        (
            "AgentLocal.StartLease",
            start_lease().prop_map(Case::StartLease).boxed(),
        ),
        (
            "AgentLocal.RevokeLease",
            (
                prop_oneof![2 => any::<usize>().prop_map(Ok), 1 => text().prop_map(Err)],
                any::<bool>(),
            )
                .prop_map(|(l, now)| Case::RevokeLease(l, now))
                .boxed(),
        ),
        (
            "AgentLocal.Drain",
            (either("[a-z ]{1,20}", text()), any::<bool>())
                .prop_map(|(reason, now)| Case::LocalDrain(pb::DrainRequest { reason, now }))
                .boxed(),
        ),
        (
            "AgentLocal.ClearGpu",
            (small_or(0u32..9, u32s()), either("[a-z ]{1,20}", text()))
                .prop_map(|(index, reason)| Case::ClearGpu(pb::ClearGpuRequest { index, reason }))
                .boxed(),
        ),
        ("AgentLocal.Undrain", Just(Case::Undrain).boxed()),
        (
            "AgentLocal.Events",
            i64s()
                .prop_map(|since_unix| Case::Events(pb::EventsRequest { since_unix }))
                .boxed(),
        ),
        ("AgentLocal.ListLeases", Just(Case::ListLeases).boxed()),
        (
            "AgentLocal.ReadLog",
            (
                u64s(),
                either(
                    prop::sample::select(&["L-1", "L-2", "A-1"][..]).prop_map(str::to_string),
                    lease_id(),
                ),
                either(0i32..3, enums()),
                small_or(0u64..64, u64s()),
                small_or(0u32..(2 << 20), u32s()),
            )
                .prop_map(|(request_id, lease_id, stream, offset, max_bytes)| {
                    Case::ReadLog(pb::ReadLogRequest {
                        request_id,
                        lease_id,
                        stream,
                        offset,
                        max_bytes,
                    })
                })
                .boxed(),
        ),
        ("AgentLocal.ListGpus", Just(Case::ListGpus).boxed()),
        (
            "AgentLocal (raw bytes)",
            (prop::sample::select(AGENT_PATHS), raw_bytes())
                .prop_map(|(p, b)| Case::Raw(true, p, b))
                .boxed(),
        ),
        // allotd's services, the user commands also through the agent.
        (
            "Workloads.Submit",
            (
                c(),
                prop_oneof![1 => Just(None), 6 => spec().prop_map(Some)],
            )
                .prop_map(|(w, spec)| Case::Submit(w, pb::SubmitRequest { spec }))
                .boxed(),
        ),
        (
            "Workloads.Cancel",
            (c(), workload_id())
                .prop_map(|(w, id)| Case::Cancel(w, pb::CancelRequest { id }))
                .boxed(),
        ),
        (
            "Workloads.Get",
            (c(), workload_id())
                .prop_map(|(w, id)| Case::Get(w, pb::GetRequest { id }))
                .boxed(),
        ),
        (
            "Workloads.List",
            (
                c(),
                either(safe(&["", "p-a"]), project()),
                either(safe(&["", "root"]), text()),
                either(0i32..8, enums()),
                either(safe(&["", "train-7"]), text()),
            )
                .prop_map(|(w, project, user, state, name)| {
                    Case::List(
                        w,
                        pb::ListRequest {
                            project,
                            user,
                            state,
                            name,
                        },
                    )
                })
                .boxed(),
        ),
        (
            "Workloads.Watch",
            (c(), workload_id())
                .prop_map(|(w, id)| Case::Watch(w, pb::WatchRequest { id }))
                .boxed(),
        ),
        (
            "Workloads.Logs",
            (
                c(),
                workload_id(),
                any::<bool>(),
                small_or(0u32..4, u32s()),
                small_or(0u32..3, u32s()),
                either(0i32..3, enums()),
            )
                .prop_map(|(w, id, follow, run, rank, stream)| {
                    Case::Logs(
                        w,
                        pb::LogsRequest {
                            id,
                            follow,
                            run,
                            rank,
                            stream,
                        },
                    )
                })
                .boxed(),
        ),
        ("Org.GetTree", c().prop_map(Case::GetTree).boxed()),
        (
            "Org.SetWeight",
            (
                c(),
                either(safe(&["p-a", "p-b", "team-a"]), name_text()),
                either(0.1f64..100.0, f64s()),
            )
                .prop_map(|(w, name, weight)| {
                    Case::SetWeight(w, pb::SetWeightRequest { name, weight })
                })
                .boxed(),
        ),
        ("Nodes.List", c().prop_map(Case::ListNodes).boxed()),
        (
            "Nodes.Drain",
            (
                c(),
                either(safe(&["node-0", "node-1"]), name_text()),
                either("[a-z ]{1,20}", text()),
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(|(w, name, reason, now, undrain)| {
                    Case::Drain(
                        w,
                        pb::NodeDrainRequest {
                            name,
                            reason,
                            now,
                            undrain,
                        },
                    )
                })
                .boxed(),
        ),
        (
            "AgentStream.Session",
            (
                prop_oneof![3 => Just(Caller::Node(0)), 2 => allotd_only()],
                session_messages(),
            )
                .prop_map(|(w, m)| Case::Session(w, m))
                .boxed(),
        ),
        (
            "Enrollment.Enroll",
            (
                allotd_only(),
                prop_oneof![2 => text().prop_map(Secret::Text), 1 => Just(Secret::Fresh)],
                csr(),
            )
                .prop_map(|(w, s, c)| Case::Enroll(w, s, c))
                .boxed(),
        ),
        // Renewals speak as node 1: two would retire node 0's certificate.
        (
            "Enrollment.Renew",
            (caller(1, false), csr())
                .prop_map(|(w, c)| Case::Renew(w, c))
                .boxed(),
        ),
        (
            "Admin.CreateToken",
            (
                allotd_only(),
                either("[a-z]{1,10}", name_text()),
                either(0u64..1_000_000, u64s()),
                either("[a-z ]{0,20}", text()),
            )
                .prop_map(|(w, user, ttl_s, note)| {
                    Case::CreateToken(w, pb::CreateTokenRequest { user, ttl_s, note })
                })
                .boxed(),
        ),
        (
            "Admin.ListTokens",
            allotd_only().prop_map(Case::ListTokens).boxed(),
        ),
        (
            "Admin.RevokeToken",
            (allotd_only(), pick())
                .prop_map(|(w, p)| Case::RevokeToken(w, p))
                .boxed(),
        ),
        (
            "Admin.EnrollNode",
            (
                allotd_only(),
                either("fz-offered-[a-z0-9]{1,8}", name_text()),
                either(0u64..100_000, u64s()),
            )
                .prop_map(|(w, node, ttl_s)| {
                    Case::EnrollNode(w, pb::EnrollNodeRequest { node, ttl_s })
                })
                .boxed(),
        ),
        (
            "Admin.ListNodeCredentials",
            allotd_only().prop_map(Case::ListNodeCredentials).boxed(),
        ),
        (
            "allotd (raw bytes)",
            (prop::sample::select(ALLOTD_PATHS), raw_bytes())
                .prop_map(|(p, b)| Case::Raw(false, p, b))
                .boxed(),
        ),
        // Last: they may revoke or remove node 1.
        (
            "Admin.RevokeNode",
            (allotd_only(), pick())
                .prop_map(|(w, p)| Case::RevokeNode(w, p))
                .boxed(),
        ),
        (
            "Admin.RemoveNode",
            (allotd_only(), pick())
                .prop_map(|(w, p)| Case::RemoveNode(w, p))
                .boxed(),
        ),
    ]
}

// ------------------------------------------------------------------ calls

/// What a call came to: an answer (a refusal is a `Status`), or the words for a
/// hang.
type Outcome = Result<Result<(), Status>, String>;

/// `f` within [`BOUND`].
async fn bounded<T>(what: &str, f: impl Future<Output = Result<T, Status>>) -> Outcome {
    match tokio::time::timeout(BOUND, f).await {
        Ok(r) => Ok(r.map(drop)),
        Err(_) => Err(format!("{what}: no answer within {BOUND:?}")),
    }
}

/// Sends bytes as they are; answers bytes.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        use prost::bytes::Buf;
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n).to_vec()))
    }
}

/// The running cluster and a channel for each way of asking.
struct World {
    c: Cluster,
    anonymous: Channel,
    nodes: [Channel; 2],
    agent: Channel,
    /// alice's token.
    user_token: String,
    seq: std::sync::atomic::AtomicU64,
}

impl World {
    fn next(&self) -> u64 {
        self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    fn channel(&self, who: &Caller) -> Channel {
        match who {
            Caller::Node(i) => self.nodes[*i].clone(),
            Caller::Vouched(_) => self.nodes[0].clone(),
            Caller::ViaAgent => self.agent.clone(),
            Caller::Anonymous | Caller::Admin | Caller::User | Caller::Forged(_) => {
                self.anonymous.clone()
            }
        }
    }

    /// `msg` with the caller's headers (one that is no header value is left off).
    fn request<T>(&self, who: &Caller, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        let header = match who {
            Caller::Admin => Some(("authorization", format!("Bearer {}", self.c.token))),
            Caller::User => Some(("authorization", format!("Bearer {}", self.user_token))),
            Caller::Forged(t) => Some(("authorization", t.clone())),
            Caller::Vouched(u) => Some(("x-allot-user", u.clone())),
            _ => None,
        };
        if let Some((k, v)) = header {
            if let Ok(v) = v.parse() {
                r.metadata_mut().insert(k, v);
            }
        }
        r
    }

    fn workloads(&self, who: &Caller) -> pb::workloads_client::WorkloadsClient<Channel> {
        pb::workloads_client::WorkloadsClient::new(self.channel(who))
    }

    fn admin(&self, who: &Caller) -> pb::admin_client::AdminClient<Channel> {
        pb::admin_client::AdminClient::new(self.channel(who))
    }

    fn local(&self) -> pb::agent_local_client::AgentLocalClient<Channel> {
        pb::agent_local_client::AgentLocalClient::new(self.agent.clone())
    }

    /// A signing request as the case asks for it.
    fn csr_pem(c: &Csr) -> String {
        let valid = |name: &str| {
            allot_auth::pki::node_request(name)
                .or_else(|_| allot_auth::pki::node_request("fz-fallback"))
                .expect("a signing request")
                .1
        };
        match c {
            Csr::Text(t) => t.clone(),
            Csr::Valid(name) => valid(name),
            Csr::Mangled(name, i, b) => {
                let mut bytes = valid(name).into_bytes();
                let at = i % bytes.len();
                bytes[at] = *b;
                String::from_utf8_lossy(&bytes).into_owned()
            }
        }
    }

    /// A fresh enrollment token for a node of its own, made as admin.
    async fn fresh_offer(&self, node: &str) -> Result<String, String> {
        let r = self
            .admin(&Caller::Admin)
            .enroll_node(self.request(
                &Caller::Admin,
                pb::EnrollNodeRequest {
                    node: node.into(),
                    ttl_s: 0,
                },
            ))
            .await
            .map_err(|s| format!("setup: offering {node}: {s:?}"))?;
        Ok(r.into_inner().token)
    }

    /// One call: its answer, or a hang. Setup a case needs (a token to revoke, an
    /// offer to use) is done as admin and must succeed.
    async fn call(&self, case: Case) -> Outcome {
        match case {
            Case::Submit(w, r) => {
                bounded("Submit", self.workloads(&w).submit(self.request(&w, r))).await
            }
            Case::Cancel(w, r) => {
                bounded("Cancel", self.workloads(&w).cancel(self.request(&w, r))).await
            }
            Case::Get(w, r) => bounded("Get", self.workloads(&w).get(self.request(&w, r))).await,
            Case::List(w, r) => bounded("List", self.workloads(&w).list(self.request(&w, r))).await,
            Case::Watch(w, r) => self.watch(w, r).await,
            Case::Logs(w, r) => self.logs(w, r).await,
            Case::GetTree(w) => {
                bounded(
                    "GetTree",
                    pb::org_client::OrgClient::new(self.channel(&w))
                        .get_tree(self.request(&w, pb::GetTreeRequest {})),
                )
                .await
            }
            Case::SetWeight(w, r) => {
                bounded(
                    "SetWeight",
                    pb::org_client::OrgClient::new(self.channel(&w))
                        .set_weight(self.request(&w, r)),
                )
                .await
            }
            Case::ListNodes(w) => {
                bounded(
                    "Nodes.List",
                    pb::nodes_client::NodesClient::new(self.channel(&w))
                        .list(self.request(&w, pb::ListNodesRequest {})),
                )
                .await
            }
            Case::Drain(w, r) => {
                bounded(
                    "Nodes.Drain",
                    pb::nodes_client::NodesClient::new(self.channel(&w)).drain(self.request(&w, r)),
                )
                .await
            }
            Case::Session(w, msgs) => self.session(w, msgs).await,
            Case::Enroll(w, secret, c) => {
                let token = match secret {
                    Secret::Text(t) => t,
                    Secret::Fresh => {
                        self.fresh_offer(&format!("fz-enrolled-{}", self.next()))
                            .await?
                    }
                };
                let r = pb::EnrollRequest {
                    token,
                    csr_pem: Self::csr_pem(&c),
                };
                bounded(
                    "Enroll",
                    pb::enrollment_client::EnrollmentClient::new(self.channel(&w))
                        .enroll(self.request(&w, r)),
                )
                .await
            }
            Case::Renew(w, c) => {
                let r = pb::RenewRequest {
                    csr_pem: Self::csr_pem(&c),
                };
                bounded(
                    "Renew",
                    pb::enrollment_client::EnrollmentClient::new(self.channel(&w))
                        .renew(self.request(&w, r)),
                )
                .await
            }
            Case::CreateToken(w, r) => {
                bounded(
                    "CreateToken",
                    self.admin(&w).create_token(self.request(&w, r)),
                )
                .await
            }
            Case::ListTokens(w) => {
                bounded(
                    "ListTokens",
                    self.admin(&w)
                        .list_tokens(self.request(&w, pb::ListTokensRequest {})),
                )
                .await
            }
            Case::RevokeToken(w, p) => {
                let id = match p {
                    Pick::Text(t) => t,
                    Pick::Fresh => {
                        let r = pb::CreateTokenRequest {
                            user: format!("throwaway-{}", self.next()),
                            ..Default::default()
                        };
                        match self
                            .admin(&Caller::Admin)
                            .create_token(self.request(&Caller::Admin, r))
                            .await
                        {
                            Ok(t) => t.into_inner().id,
                            Err(s) => return Err(format!("setup: a throwaway token: {s:?}")),
                        }
                    }
                };
                bounded(
                    "RevokeToken",
                    self.admin(&w)
                        .revoke_token(self.request(&w, pb::RevokeTokenRequest { id })),
                )
                .await
            }
            Case::EnrollNode(w, r) => {
                bounded(
                    "EnrollNode",
                    self.admin(&w).enroll_node(self.request(&w, r)),
                )
                .await
            }
            Case::RevokeNode(w, p) => {
                let node = match p {
                    Pick::Text(t) => t,
                    Pick::Fresh => {
                        let n = format!("fz-doomed-{}", self.next());
                        self.fresh_offer(&n).await?;
                        n
                    }
                };
                bounded(
                    "RevokeNode",
                    self.admin(&w)
                        .revoke_node(self.request(&w, pb::RevokeNodeRequest { node })),
                )
                .await
            }
            Case::RemoveNode(w, p) => {
                let node = match p {
                    Pick::Text(t) => t,
                    Pick::Fresh => {
                        let n = format!("fz-retired-{}", self.next());
                        self.fresh_offer(&n).await?;
                        n
                    }
                };
                bounded(
                    "RemoveNode",
                    self.admin(&w)
                        .remove_node(self.request(&w, pb::RemoveNodeRequest { node })),
                )
                .await
            }
            Case::ListNodeCredentials(w) => {
                bounded(
                    "ListNodeCredentials",
                    self.admin(&w)
                        .list_node_credentials(self.request(&w, pb::ListNodeCredentialsRequest {})),
                )
                .await
            }
            Case::ListLeases => {
                bounded(
                    "ListLeases",
                    self.local().list_leases(pb::ListLeasesRequest {}),
                )
                .await
            }
            Case::ListGpus => {
                bounded("ListGpus", self.local().list_gpus(pb::ListGpusRequest {})).await
            }
            Case::StartLease(r) => bounded("StartLease", self.local().start_lease(r)).await,
            Case::RevokeLease(l, now) => {
                let lease_id = match l {
                    Err(t) => t,
                    Ok(n) => {
                        let leases = match self.local().list_leases(pb::ListLeasesRequest {}).await
                        {
                            Ok(r) => r.into_inner().leases,
                            Err(s) => return Err(format!("setup: listing leases: {s:?}")),
                        };
                        if leases.is_empty() {
                            "no-lease".into()
                        } else {
                            leases[n % leases.len()].id.clone()
                        }
                    }
                };
                bounded(
                    "RevokeLease",
                    self.local()
                        .revoke_lease(pb::RevokeLeaseRequest { lease_id, now }),
                )
                .await
            }
            Case::LocalDrain(r) => bounded("Drain", self.local().drain(r)).await,
            Case::Undrain => bounded("Undrain", self.local().undrain(pb::UndrainRequest {})).await,
            Case::Events(r) => bounded("Events", self.local().events(r)).await,
            Case::ClearGpu(r) => bounded("ClearGpu", self.local().clear_gpu(r)).await,
            Case::ReadLog(r) => bounded("ReadLog", self.local().read_log(r)).await,
            Case::Raw(agent, path, bytes) => {
                let (channel, who) = if agent {
                    (self.agent.clone(), Caller::ViaAgent)
                } else {
                    (self.anonymous.clone(), Caller::Admin)
                };
                let mut g = tonic::client::Grpc::new(channel);
                bounded(path, async {
                    g.ready()
                        .await
                        .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
                    g.unary(
                        self.request(&who, bytes),
                        tonic::codegen::http::uri::PathAndQuery::from_static(path),
                        RawCodec,
                    )
                    .await
                })
                .await
            }
        }
    }

    /// A Watch: the call and its first message, each within the bound; then dropped.
    async fn watch(&self, w: Caller, r: pb::WatchRequest) -> Outcome {
        let mut client = self.workloads(&w);
        let answer = match tokio::time::timeout(BOUND, client.watch(self.request(&w, r))).await {
            Err(_) => return Err(format!("Watch: no answer within {BOUND:?}")),
            Ok(a) => a,
        };
        let mut stream = match answer {
            Ok(s) => s.into_inner(),
            Err(s) => return Ok(Err(s)),
        };
        match tokio::time::timeout(BOUND, stream.message()).await {
            Err(_) => Err(format!("Watch: no first message within {BOUND:?}")),
            Ok(Ok(Some(_))) => Ok(Ok(())),
            Ok(Ok(None)) => Err("Watch: the stream ended without the workload".into()),
            Ok(Err(s)) => Ok(Err(s)),
        }
    }

    /// A Logs call: the answer within the bound, then the stream to its end within
    /// the bound too; a stream that follows a live run may stay open (that is its
    /// point), and is dropped then.
    async fn logs(&self, w: Caller, r: pb::LogsRequest) -> Outcome {
        let follow = r.follow;
        let mut client = self.workloads(&w);
        let answer = match tokio::time::timeout(BOUND, client.logs(self.request(&w, r))).await {
            Err(_) => return Err(format!("Logs: no answer within {BOUND:?}")),
            Ok(a) => a,
        };
        let mut stream = match answer {
            Ok(s) => s.into_inner(),
            Err(s) => return Ok(Err(s)),
        };
        let until = tokio::time::Instant::now() + BOUND;
        loop {
            match tokio::time::timeout_at(until, stream.message()).await {
                Err(_) if follow => return Ok(Ok(())),
                Err(_) => return Err(format!("Logs: the stream did not end within {BOUND:?}")),
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => return Ok(Ok(())),
                Ok(Err(s)) => return Ok(Err(s)),
            }
        }
    }

    /// A session: the messages, then the end of the stream. The answer and every
    /// message allotd sends come within the bound, and allotd ends its side once
    /// the agent's has ended.
    async fn session(&self, w: Caller, msgs: Vec<pb::AgentMessage>) -> Outcome {
        let mut client = pb::agent_stream_client::AgentStreamClient::new(self.channel(&w));
        let req = self.request(&w, tokio_stream::iter(msgs));
        let answer = match tokio::time::timeout(BOUND, client.session(req)).await {
            Err(_) => return Err(format!("Session: no answer within {BOUND:?}")),
            Ok(a) => a,
        };
        let mut stream = match answer {
            Ok(s) => s.into_inner(),
            Err(s) => return Ok(Err(s)),
        };
        let until = tokio::time::Instant::now() + BOUND;
        loop {
            match tokio::time::timeout_at(until, stream.message()).await {
                Err(_) => {
                    return Err(format!(
                        "Session: allotd's side still open {BOUND:?} after the agent's ended"
                    ))
                }
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => return Ok(Ok(())),
                Ok(Err(s)) => return Ok(Err(s)),
            }
        }
    }
}

/// A refusal as people get it: a known code, one line of readable text.
fn judge(case: &Case, outcome: Outcome) -> Result<(), TestCaseError> {
    let s = match outcome {
        Err(hang) => return Err(TestCaseError::fail(hang)),
        Ok(Ok(())) => return Ok(()),
        Ok(Err(s)) => s,
    };
    let m = s.message();
    // Headers over allotd's 64 KiB (`http2_max_header_list_size`) are refused by
    // HTTP/2 itself with status 431 before gRPC sees the request; tonic's client
    // maps an HTTP status without a gRPC one to UNKNOWN, as gRPC's HTTP mapping says.
    let oversized = header_bytes(case) > 60 * 1024
        && s.code() == Code::Unknown
        && m.contains("HTTP status code 431");
    let wrong = match s.code() {
        Code::Unknown if oversized => None,
        Code::Unknown | Code::Internal => Some("an UNKNOWN or INTERNAL status"),
        Code::Ok => Some("an error with code OK"),
        _ if m.trim().is_empty() => Some("no message"),
        _ if m.len() > MAX_MESSAGE => Some("a message over 8 KiB"),
        _ if m.chars().any(char::is_control) => Some("a control character in the message"),
        _ => None,
    };
    match wrong {
        None => Ok(()),
        Some(why) => Err(TestCaseError::fail(format!(
            "{why}: {:?}: {}",
            s.code(),
            cut(m, 600)
        ))),
    }
}

/// The longest header value a case sends.
fn header_bytes(case: &Case) -> usize {
    let who = match case {
        Case::Submit(w, _)
        | Case::Cancel(w, _)
        | Case::Get(w, _)
        | Case::List(w, _)
        | Case::Watch(w, _)
        | Case::Logs(w, _)
        | Case::SetWeight(w, _)
        | Case::Drain(w, _)
        | Case::Session(w, _)
        | Case::Enroll(w, _, _)
        | Case::Renew(w, _)
        | Case::CreateToken(w, _)
        | Case::RevokeToken(w, _)
        | Case::EnrollNode(w, _)
        | Case::RevokeNode(w, _)
        | Case::RemoveNode(w, _) => w,
        Case::GetTree(w)
        | Case::ListNodes(w)
        | Case::ListTokens(w)
        | Case::ListNodeCredentials(w) => w,
        _ => return 0,
    };
    match who {
        Caller::Forged(t) | Caller::Vouched(t) => t.len(),
        _ => 0,
    }
}

fn cut(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES)
}

fn org() -> &'static str {
    "[[group]]\nname = \"team-a\"\nweight = 1\nmembers = [\"alice\"]\nmanagers = [\"alice\"]\n[[group]]\nname = \"p-a\"\nparent = \"team-a\"\nweight = 1\n[[group]]\nname = \"p-b\"\nweight = 1\n[auth]\nvouching_hosts = [\"node-0\"]\n"
}

/// allotd and the agents still run and answer a plain request.
fn alive(w: &mut World, rt: &tokio::runtime::Runtime) -> Result<(), String> {
    if let Some(s) =
        w.c.server
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    {
        return Err(format!("allotd exited: {s}"));
    }
    for (i, a) in w.c.agents.iter_mut().enumerate() {
        if let Some(s) = a.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            return Err(format!("agent {i} exited: {s}"));
        }
    }
    rt.block_on(async {
        let mut client = w.workloads(&Caller::Admin);
        let list = client.list(w.request(&Caller::Admin, pb::ListRequest::default()));
        match tokio::time::timeout(BOUND, list).await {
            Ok(Ok(_)) => {}
            other => return Err(format!("allotd's List as admin: {other:?}")),
        }
        match tokio::time::timeout(BOUND, w.local().list_gpus(pb::ListGpusRequest {})).await {
            Ok(Ok(_)) => Ok(()),
            other => Err(format!("the agent's ListGpus: {other:?}")),
        }
    })
}

#[test]
fn every_rpc_answers_generated_messages_in_time_with_a_clear_status() {
    let t0 = Instant::now();
    let c = Cluster::start("rpc-props", org(), 2, 4);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let agent_socket = c.node_dir(0).join("agent.sock");
    let mut w = rt.block_on(async {
        World {
            anonymous: c.channel(None).await,
            nodes: [c.channel(Some(0)).await, c.channel(Some(1)).await],
            agent: allot_proto::uds::connect(&agent_socket)
                .await
                .expect("the agent's socket"),
            user_token: String::new(),
            seq: std::sync::atomic::AtomicU64::new(1),
            c,
        }
    });
    let alice = pb::CreateTokenRequest {
        user: "alice".into(),
        ..Default::default()
    };
    w.user_token = rt
        .block_on(
            w.admin(&Caller::Admin)
                .create_token(w.request(&Caller::Admin, alice)),
        )
        .expect("alice's token")
        .into_inner()
        .token;
    // Work for Cancel, Get, Watch and LeaseStatus to find: waiting and running.
    for (gpus_per_node, nodes, argv) in [(1, 1, "sleep"), (2, 2, "true")] {
        let r = pb::SubmitRequest {
            spec: Some(pb::WorkloadSpec {
                project: "p-a".into(),
                gpus_per_node,
                nodes,
                argv: vec![argv.into(), "600".into()],
                ..Default::default()
            }),
        };
        rt.block_on(
            w.workloads(&Caller::Admin)
                .submit(w.request(&Caller::Admin, r)),
        )
        .expect("a plain submission");
    }
    eprintln!("cluster up in {:?}", t0.elapsed());
    // ALLOT_FUZZ_SHOW=1 prints every refusal.
    let show = std::env::var_os("ALLOT_FUZZ_SHOW").is_some();
    let mut failures = Vec::new();
    let mut summary = HashMap::new();
    for (name, strategy) in families() {
        let started = Instant::now();
        let mut runner = TestRunner::new(Config {
            cases: cases(),
            failure_persistence: None,
            max_shrink_iters: 256,
            max_shrink_time: 60_000,
            ..Config::default()
        });
        let world = &w;
        // What the cases came to, by code: the allowed paths are taken too.
        let tally = std::cell::RefCell::new(std::collections::BTreeMap::<String, u32>::new());
        let result = runner.run(&strategy, |case| {
            let outcome = rt.block_on(world.call(case.clone()));
            let key = match &outcome {
                Ok(Ok(())) => "Ok".to_string(),
                Ok(Err(s)) => format!("{:?}", s.code()),
                Err(_) => "hang".to_string(),
            };
            if show {
                if let Ok(Err(s)) = &outcome {
                    eprintln!("  {name}: {:?} {}", s.code(), cut(s.message(), 300));
                }
            }
            *tally.borrow_mut().entry(key).or_default() += 1;
            judge(&case, outcome)
        });
        if let Err(e) = result {
            failures.push(format!("{name}: {}", cut(&e.to_string(), 4000)));
        }
        if let Err(e) = alive(&mut w, &rt) {
            failures.push(format!("after {name}: {e}"));
            break;
        }
        summary.insert(name, started.elapsed());
        let tally: Vec<String> = tally
            .into_inner()
            .into_iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        eprintln!(
            "{name}: {} cases in {:?} ({})",
            cases(),
            started.elapsed(),
            tally.join(", ")
        );
    }
    // Timers the cases set (time limits of a second, revocations) come due: the
    // daemons outlive them too.
    std::thread::sleep(Duration::from_secs(3));
    if let Err(e) = alive(&mut w, &rt) {
        failures.push(format!("at the end: {e}"));
    }
    for (what, log) in [
        ("allotd", w.c.dir.join("allotd.log")),
        ("agent 0", w.c.node_dir(0).join("agent.log")),
        ("agent 1", w.c.node_dir(1).join("agent.log")),
    ] {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(at) = text.find("panicked") {
            failures.push(format!(
                "{what} panicked: {}",
                cut(&text[at.saturating_sub(200)..], 2000)
            ));
        }
    }
    eprintln!("{} RPCs in {:?}", summary.len(), t0.elapsed());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
