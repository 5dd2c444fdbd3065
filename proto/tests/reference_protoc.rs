//! The proto compiles with the reference compiler (libprotoc), not only with protox,
//! so that Python, Go and grpcurl clients can be generated from it. Under `CI=true`
//! a missing `protoc` fails the test; elsewhere it is skipped with a note.

use std::path::Path;
use std::process::Command;

#[test]
fn every_proto_compiles_with_the_reference_protoc() {
    let protoc = std::env::var("PROTOC").unwrap_or_else(|_| "protoc".into());
    let version = match Command::new(&protoc).arg("--version").output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: the reference protoc must be installed (apt-get install protobuf-compiler)"
            );
            eprintln!("skipped: no {protoc} on PATH");
            return;
        }
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut protos = Vec::new();
    let mut dirs = vec![root.join("allot")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("proto dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "proto") {
                protos.push(p.strip_prefix(root).expect("under root").to_path_buf());
            }
        }
    }
    assert!(!protos.is_empty());
    let out = std::env::temp_dir().join(format!("allot-protoc-{}.pb", std::process::id()));
    let o = Command::new(&protoc)
        .current_dir(root)
        .arg("-I.")
        .arg(format!("--descriptor_set_out={}", out.display()))
        .args(&protos)
        .output()
        .expect("protoc runs");
    let _ = std::fs::remove_file(&out);
    assert!(
        o.status.success(),
        "{version} refuses {protos:?}:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
