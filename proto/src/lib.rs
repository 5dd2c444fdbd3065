//! `allot.v1`: the wire API between allotd, allot-agent and the CLI.
//!
//! Placeholder crate: the protobuf definitions and their generated tonic/prost code
//! arrive with the allocator service (issue 5). Only this crate and the service
//! shells will know the wire format.
