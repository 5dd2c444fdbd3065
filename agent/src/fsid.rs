//! Opening a file as a user, not as root: the thread's file-system identity (fsuid,
//! fsgid, groups) is switched for the one call and switched back, so the kernel
//! decides as it would for that user, symlinks and directory modes included.

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

impl FsUser {
    /// The local account `name` (or a bare uid) with its groups; `None` when the
    /// host does not know it.
    pub fn named(name: &str) -> Option<FsUser> {
        let u = match nix::unistd::User::from_name(name).ok().flatten() {
            Some(u) => u,
            None => nix::unistd::User::from_uid(Uid::from_raw(name.parse().ok()?))
                .ok()
                .flatten()?,
        };
        let c = std::ffi::CString::new(u.name.as_str()).ok()?;
        let groups = nix::unistd::getgrouplist(&c, u.gid)
            .map(|g| g.into_iter().map(Gid::as_raw).collect())
            .unwrap_or_else(|_| vec![u.gid.as_raw()]);
        Some(FsUser {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
            groups,
        })
    }
}

/// Runs `f` (an open, a stat) with `user`'s file-system identity on this thread.
/// The caller must not yield to other work inside `f`: the identity is the
/// thread's.
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
