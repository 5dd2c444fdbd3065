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

pub mod uds;
