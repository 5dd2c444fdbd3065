//! The generated wire types: round trips, defaults, and bad bytes.

use allot_proto::v1::{
    agent_local_client::AgentLocalClient, agent_local_server::AgentLocal, agent_message,
    agent_stream_server::AgentStream, AgentMessage, DrainInfo, Gpu, GpuState, Lease, LeaseState,
    Register, WorkloadSpec,
};
use prost::Message;
use std::collections::HashMap;

#[test]
fn agent_registration_round_trips() {
    let msg = AgentMessage {
        body: Some(agent_message::Body::Register(Register {
            host: "gpu-017".into(),
            cluster: "ai2".into(),
            labels: HashMap::from([("rack".into(), "r12".into())]),
            cpu: 112,
            memory_gb: 2048,
            gpus: vec![Gpu {
                uuid: "GPU-1".into(),
                index: 0,
                pci: "0000:18:00".into(),
                model: "NVIDIA H100 80GB HBM3".into(),
                state: GpuState::Healthy as i32,
                ..Gpu::default()
            }],
            running: vec![Lease {
                id: "L1".into(),
                time_limit_s: Some(7_200),
                state: LeaseState::Running as i32,
                ..Lease::default()
            }],
            drains: vec![DrainInfo {
                by: "local-operator".into(),
                author: "alice".into(),
                reason: "rack work".into(),
                ..DrainInfo::default()
            }],
            protocol: 2,
            advertise_addr: "10.0.0.17".into(),
            highest_workload: 41,
            highest_lease: 77,
            gpu_type: "h100".into(),
            features: vec!["nvlink".into()],
            fence_s: 755,
        })),
    };
    let bytes = msg.encode_to_vec();
    let back = AgentMessage::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(back, msg);
    let Some(agent_message::Body::Register(r)) = back.body else {
        panic!("a registration")
    };
    assert_eq!(
        r.running[0].time_limit_s,
        Some(7_200),
        "optional fields keep presence"
    );
    assert_eq!(r.gpus[0].state(), GpuState::Healthy);
    assert_eq!(r.advertise_addr, "10.0.0.17");
}

#[test]
fn missing_and_unknown_values_are_visible() {
    // A spec with nothing set decodes to zeros and UNSPECIFIED, which shells must
    // refuse with the field's name rather than take as real values.
    let empty = WorkloadSpec::decode(&[][..]).expect("decodes");
    assert_eq!((empty.gpus_per_node, empty.time_limit_s), (0, None));
    let l = Lease {
        state: 99,
        ..Lease::default()
    };
    let back = Lease::decode(l.encode_to_vec().as_slice()).expect("decodes");
    assert!(
        LeaseState::try_from(back.state).is_err(),
        "an unknown enum value stays detectable"
    );
    // Garbage is an error, not a panic.
    assert!(AgentMessage::decode(&[0xff, 0xff, 0xff, 0xff, 0x0f][..]).is_err());
}

/// The services exist with the expected names (a compile-time check).
#[allow(dead_code)]
fn services<A: AgentLocal, S: AgentStream>(
    local: A,
    stream: S,
) -> (A, S, Option<AgentLocalClient<tonic::transport::Channel>>) {
    (local, stream, None)
}

#[test]
fn lease_end_names_round_trip_and_unknown_text_is_unspecified() {
    use allot_proto::v1::LeaseEnd;
    for e in [
        LeaseEnd::Exited,
        LeaseEnd::Revoked,
        LeaseEnd::TimeLimit,
        LeaseEnd::GpuLost,
        LeaseEnd::Vanished,
        LeaseEnd::Refused,
        LeaseEnd::FailedToStart,
    ] {
        assert!(!e.name().is_empty());
        assert_eq!(LeaseEnd::from_name(e.name()), e);
    }
    assert_eq!(LeaseEnd::from_name("exploded"), LeaseEnd::Unspecified);
    assert_eq!(LeaseEnd::Unspecified.name(), "");
}
