//! Opening a file as a user, not as root: the file-system identity (fsuid, fsgid,
//! groups) is switched for the one call and switched back, so the kernel decides as
//! it would for that user, symlinks and directory modes included. For a process of
//! one thread only (the supervisor): the group list is the whole process's.

use nix::unistd::{getgroups, setfsgid, setfsuid, setgroups, Gid, Uid};

/// Who a file is opened as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsUser {
    /// The user's uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its groups, the primary one included.
    pub groups: Vec<u32>,
}

/// Runs `f` (an open, a stat) with `user`'s file-system identity. The caller is a
/// process of one thread: `setgroups` changes every thread's groups.
pub fn as_user<T>(user: &FsUser, f: impl FnOnce() -> T) -> Result<T, String> {
    let before = getgroups().map_err(|e| format!("getgroups: {e}"))?;
    let groups: Vec<Gid> = user.groups.iter().map(|g| Gid::from_raw(*g)).collect();
    setgroups(&groups).map_err(|e| format!("setgroups: {e}"))?;
    let old_gid = setfsgid(Gid::from_raw(user.gid));
    let old_uid = setfsuid(Uid::from_raw(user.uid));
    let out = f();
    setfsuid(old_uid);
    setfsgid(old_gid);
    let _ = setgroups(&before);
    Ok(out)
}
