//! Nothing to build: this package carries the deb and rpm metadata of `allot` in its
//! Cargo.toml (see `packaging/build.sh`).

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn docs(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("docs/ is readable") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                docs(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }

    /// Every page under `docs/` ships in the deb and the rpm (the installed pages
    /// link to each other), and every page the packages name exists.
    #[test]
    fn every_doc_ships_in_both_packages() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let manifest =
            std::fs::read_to_string(root.join("packaging/Cargo.toml")).expect("Cargo.toml");
        let mut pages = Vec::new();
        docs(&root.join("docs"), &mut pages);
        assert!(pages.len() > 10, "{pages:?}");
        for p in &pages {
            let rel = p.strip_prefix(&root).expect("under the root").display();
            let deb = format!("[\"../{rel}\", \"usr/share/doc/allot/{rel}\", \"644\"]");
            let rpm = format!("source = \"../{rel}\", dest = \"/usr/share/doc/allot/{rel}\"");
            assert!(
                manifest.contains(&deb),
                "{rel} is not in the deb's assets: add {deb}"
            );
            assert!(
                manifest.contains(&rpm),
                "{rel} is not in the rpm's assets: add {{ {rpm}, mode = \"644\", doc = true }}"
            );
        }
        for named in manifest.split("\"../docs/").skip(1) {
            let rel = named.split('"').next().unwrap_or_default();
            assert!(
                root.join("docs").join(rel).is_file(),
                "docs/{rel} is packaged but missing"
            );
        }
    }
}
