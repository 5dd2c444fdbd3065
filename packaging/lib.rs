//! Nothing to build: this package carries the deb and rpm metadata of `allot` in its
//! Cargo.toml (see `packaging/build.sh`).
