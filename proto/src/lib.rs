//! `allot.v1`: the wire API between allotd, allot-agent and the CLI.
//!
//! Generated at build time from `proto/allot/v1/allot.proto` by protox (a pure-Rust
//! protobuf compiler, so building needs no system `protoc`) and tonic-prost-build.
//! Only this crate and the service shells know these types.

#![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]

/// Messages, clients (`*_client`) and servers (`*_server`) of package `allot.v1`.
pub mod v1 {
    tonic::include_proto!("allot.v1");
}

pub mod codec;
pub mod names;
pub mod uds;

impl v1::LeaseEnd {
    /// The name people read and 0.1 agents sent as `end_reason`: `exited`, `revoked`,
    /// `time-limit`, `gpu-lost`, `vanished`, `refused`, `failed-to-start`, `fenced`; empty for
    /// an unspecified end.
    pub fn name(self) -> &'static str {
        use v1::LeaseEnd as E;
        match self {
            E::Unspecified => "",
            E::Exited => "exited",
            E::Revoked => "revoked",
            E::TimeLimit => "time-limit",
            E::GpuLost => "gpu-lost",
            E::Vanished => "vanished",
            E::Refused => "refused",
            E::FailedToStart => "failed-to-start",
            E::Fenced => "fenced",
        }
    }

    /// The end named by [`v1::LeaseEnd::name`]; unspecified for any other text.
    pub fn from_name(name: &str) -> v1::LeaseEnd {
        use v1::LeaseEnd as E;
        [
            E::Exited,
            E::Revoked,
            E::TimeLimit,
            E::GpuLost,
            E::Vanished,
            E::Refused,
            E::FailedToStart,
            E::Fenced,
        ]
        .into_iter()
        .find(|e| e.name() == name)
        .unwrap_or(E::Unspecified)
    }
}
