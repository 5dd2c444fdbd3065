//! Writing a file whole or not at all, with its mode from the start: keys and
//! certificates must never be seen half-written or, for a key, readable by others
//! even for a moment.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Writes `text` to `path` through a temporary file created with `mode` (e.g. 0o600
/// for a key), synced, then renamed over `path`.
pub fn write_atomic(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_file_has_its_mode_and_whole_text() {
        let dir = std::env::temp_dir().join(format!("allot-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join("node.key");
        write_atomic(&p, "old", 0o644).expect("write");
        write_atomic(&p, "secret", 0o600).expect("rewrite");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "secret");
        let mode = std::fs::metadata(&p).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!p.with_extension("tmp").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
