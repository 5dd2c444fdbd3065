//! Where a workload starts: the submitted working directory must exist on the host,
//! be a directory, and be enterable by the workload's user. Checked before the
//! launch so that a missing directory fails the start with a reason that names it
//! (a failed `chdir` between fork and exec says only "No such file or directory",
//! as a missing program does), and because the agent changes directory as root,
//! before the switch to the user: the user's own right to enter is checked here.
//!
//! The check reads mode bits, owners and groups (search permission on the
//! directory and every directory above it); ACLs and root-squashed network file
//! systems are not modelled: a start they refuse fails at the `chdir` instead.

use allot_checkpoint_hooks::{Identity, RunAs};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Whether `id` may search (enter) a directory of this owner, group and mode.
pub fn may_enter(id: &Identity, uid: u32, gid: u32, mode: u32) -> bool {
    if id.uid == 0 {
        // Root searches any directory (CAP_DAC_OVERRIDE), whatever its bits.
        return true;
    }
    let bit = if uid == id.uid {
        0o100
    } else if gid == id.gid || id.groups.contains(&gid) {
        0o010
    } else {
        0o001
    };
    mode & bit != 0
}

/// Whether work can start in `dir` as `who`; otherwise why not, naming the
/// directory.
pub fn check(dir: &Path, who: &RunAs) -> Result<(), String> {
    let shown = dir.display();
    if !dir.is_absolute() {
        return Err(format!("{shown} is not an absolute path"));
    }
    let md = std::fs::metadata(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{shown} does not exist"),
        _ => format!("{shown} cannot be read: {e}"),
    })?;
    if !md.is_dir() {
        return Err(format!("{shown} is not a directory"));
    }
    match who {
        RunAs::Nobody(why) => Err(why.clone()),
        RunAs::Agent => nix::unistd::access(dir, nix::unistd::AccessFlags::X_OK)
            .map_err(|e| format!("{shown} cannot be entered by the agent's user: {e}")),
        RunAs::User(id) => {
            // Every directory on the way down must be searchable, the last included.
            let mut steps: Vec<&Path> = dir.ancestors().collect();
            steps.reverse();
            for p in steps {
                let m = std::fs::metadata(p)
                    .map_err(|e| format!("{} cannot be read: {e}", p.display()))?;
                if !may_enter(id, m.uid(), m.gid(), m.mode()) {
                    return Err(format!(
                        "{shown} cannot be entered by uid {}: {} is mode {:o}, owner {}:{}",
                        id.uid,
                        p.display(),
                        m.mode() & 0o7777,
                        m.uid(),
                        m.gid()
                    ));
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ana() -> Identity {
        Identity {
            uid: 1000,
            gid: 100,
            groups: vec![100, 44],
        }
    }

    #[test]
    fn search_permission_follows_owner_group_other() {
        assert!(may_enter(&ana(), 1000, 1, 0o700));
        assert!(!may_enter(&ana(), 1001, 1, 0o770));
        assert!(may_enter(&ana(), 1001, 44, 0o710));
        assert!(!may_enter(&ana(), 1001, 45, 0o770));
        assert!(may_enter(&ana(), 1001, 45, 0o701));
        // The owner's bits decide for the owner, even when others may.
        assert!(!may_enter(&ana(), 1000, 1, 0o077));
        let root = Identity {
            uid: 0,
            gid: 0,
            groups: vec![0],
        };
        assert!(may_enter(&root, 5, 5, 0o000));
    }

    #[test]
    fn a_missing_or_non_directory_is_named() {
        let tmp = std::env::temp_dir().join(format!("allot-workdir-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).expect("dir");
        assert_eq!(check(&tmp, &RunAs::Agent), Ok(()));
        let gone = tmp.join("gone");
        let e = check(&gone, &RunAs::Agent).expect_err("missing");
        assert!(e.ends_with("gone does not exist"), "{e}");
        let file = tmp.join("f");
        std::fs::write(&file, "x").expect("file");
        let e = check(&file, &RunAs::Agent).expect_err("a file");
        assert!(e.contains("is not a directory"), "{e}");
        assert!(check(Path::new("rel"), &RunAs::Agent).is_err());
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
