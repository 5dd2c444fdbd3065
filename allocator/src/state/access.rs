//! Who may do what: the one place every request's right is decided. The transport
//! proves who is asking ([`Who`]: a token, an enrolled node's certificate, a node
//! vouching for its local user, or root on the admin socket); roles come from
//! allotd.toml only (`[roles]`, `managers`/`members`/`open` on groups). A refusal
//! names the right that is missing and where it is granted.

use super::creds::{Rejected, TokenRec};
use super::input::Input;
use super::out::Applied;
use super::Allocator;
use crate::config::{AuthSection, GroupAccess, RolesSection};
use allot_fairshare::{CoreError, Time};
use std::collections::BTreeMap;

/// Who is asking, as the transport proved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// Nothing proven.
    Anonymous,
    /// A user, by a token.
    User(String),
    /// A user, vouched for by the enrolled node whose agent saw their uid.
    Vouched {
        /// The user.
        user: String,
        /// The node that vouched.
        node: String,
    },
    /// An enrolled node, by its certificate.
    Node(String),
    /// Root or allotd's own user on allotd's admin socket.
    Local,
}

impl Who {
    /// The user asking, if a user is.
    pub fn user(&self) -> Option<&str> {
        match self {
            Who::User(u) | Who::Vouched { user: u, .. } => Some(u),
            _ => None,
        }
    }

    /// Whose share of a shared limit a request takes: a user's, however proven
    /// (by token or vouched by any host), else the caller as the audit names it.
    pub fn owner(&self) -> String {
        self.user().map_or_else(|| self.name(), str::to_string)
    }

    /// Whose share of connections an authenticated connection takes: the node
    /// whose certificate it shows (vouched users ride on their node's), or the
    /// user of its token. Distinct for a node and a user of the same name.
    pub fn connection_identity(&self) -> String {
        match self {
            Who::Node(n) | Who::Vouched { node: n, .. } => format!("node {n}"),
            other => other.name(),
        }
    }

    /// How the audit log names it.
    pub fn name(&self) -> String {
        match self {
            Who::Anonymous => "anonymous".into(),
            Who::User(u) => u.clone(),
            Who::Vouched { user, node } => format!("{user} vouched by {node}"),
            Who::Node(n) => format!("node {n}"),
            Who::Local => "root on allotd's host".into(),
        }
    }
}

/// What is asked.
#[derive(Debug, Clone, Copy)]
pub enum Ask<'a> {
    /// Submit work as `user` charged to `project`.
    Submit {
        /// Project.
        project: &'a str,
        /// The user the work would run as.
        user: &'a str,
    },
    /// See one workload (get, watch).
    See(u64),
    /// Cancel one workload.
    Cancel(u64),
    /// Hold, release, requeue or change one workload (`verb` names it in a
    /// refusal): its owner and operators; with `operator_only` (lengthen its time
    /// limit, raise its priority, release an operator's hold) operators only.
    Control {
        /// The workload.
        id: u64,
        /// What is asked, in a word (`hold`, `requeue`, ...).
        verb: &'static str,
        /// Beyond what an owner may do.
        operator_only: bool,
    },
    /// Read one workload's output (`allot logs`): its owner and operators.
    Logs(u64),
    /// Type into a session's terminal (`allot attach`): its owner alone (and
    /// admins).
    Attach(u64),
    /// Read the org tree and its shares, or the node list.
    Read,
    /// Set a group's weight.
    SetWeight(&'a str),
    /// Drain or undrain a node.
    Drain,
    /// Tokens and enrollment.
    Admin,
    /// An agent's session as node `node`.
    Session(&'a str),
    /// Renew node `node`'s certificate.
    Renew(&'a str),
}

/// A refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// Nothing was proven (UNAUTHENTICATED), rather than a right missing
    /// (PERMISSION_DENIED).
    pub unauthenticated: bool,
    /// What is missing and where it is granted.
    pub message: String,
}

fn denied(message: String) -> Denied {
    Denied {
        unauthenticated: false,
        message,
    }
}

/// The configured roles.
#[derive(Debug, Clone, Default)]
pub struct Access {
    roles: RolesSection,
    auth: AuthSection,
    groups: BTreeMap<String, GroupAccess>,
}

/// The user whose roles count: one a token proves. A host vouches for its users'
/// own work only; no role comes with a vouch, however the user is named.
fn role_user(who: &Who) -> Option<&str> {
    match who {
        Who::User(u) => Some(u),
        _ => None,
    }
}

impl Access {
    /// From allotd.toml.
    pub fn new(
        roles: RolesSection,
        auth: AuthSection,
        groups: BTreeMap<String, GroupAccess>,
    ) -> Access {
        Access {
            roles,
            auth,
            groups,
        }
    }

    fn admin(&self, who: &Who) -> bool {
        match who {
            Who::Local => true,
            _ => role_user(who).is_some_and(|u| self.roles.admins.iter().any(|a| a == u)),
        }
    }

    fn operator(&self, who: &Who) -> bool {
        self.admin(who)
            || role_user(who).is_some_and(|u| self.roles.operators.iter().any(|a| a == u))
    }

    /// Why a vouch is not taken: the host may not vouch for this user (not a
    /// vouching host, and `runs_there` says the user has no work on it), or the
    /// name is root's.
    fn vouch_refused(&self, who: &Who, runs_there: impl FnOnce() -> bool) -> Option<Denied> {
        let Who::Vouched { user, node } = who else {
            return None;
        };
        let by_work = self.auth.vouch_for_running_work && runs_there();
        if !by_work && !self.auth.may_vouch(node) {
            let work = if self.auth.vouch_for_running_work {
                format!(", and {user} has no work running there")
            } else {
                String::new()
            };
            return Some(denied(format!(
                "node {node} may not vouch for its users: it is not in [auth] vouching_hosts in allotd.toml{work}; {user} needs a token (`allotd tokens create --user {user}`)"
            )));
        }
        if user == "root" {
            return Some(denied(format!(
                "root is never vouched for (node {node} vouched for it): root and system users need a token"
            )));
        }
        None
    }
}

impl Allocator {
    /// Why a vouch is not taken ([`Access::vouch_refused`], knowing where each
    /// user's work runs).
    fn vouch_refused(&self, who: &Who) -> Option<Denied> {
        self.access.vouch_refused(who, || match who {
            Who::Vouched { user, node } => self.runs_on(user, node),
            _ => false,
        })
    }

    /// Whether `user` has a live lease placed on `node`.
    pub fn runs_on(&self, user: &str, node: &str) -> bool {
        self.lease_hosts.iter().any(|(lease, hosts)| {
            hosts.iter().any(|(n, _)| n == node)
                && self
                    .core
                    .lease(allot_fairshare::LeaseId(*lease))
                    .and_then(|l| self.core.workload(l.workload))
                    .is_some_and(|w| w.spec.user == user)
        })
    }
}

/// The one call anyone may make without a credential: a host's enrollment, which
/// its one-time token in the body proves. Every other call of an anonymous peer
/// is refused at its headers (`authorize` says why).
pub const ANONYMOUS_CALLS: [&str; 1] = ["/allot.v1.Enrollment/Enroll"];

/// Whether a call of this gRPC path may be made without a credential.
pub fn anonymous_may(path: &str) -> bool {
    ANONYMOUS_CALLS.contains(&path)
}

/// A role-bearing ask refused to a vouched user, naming the way.
fn no_role_vouched(who: &Who, what: &str) -> Option<Denied> {
    let Who::Vouched { user, .. } = who else {
        return None;
    };
    Some(denied(format!(
        "{} may not {what}: a user vouched for by a host carries no role (operator, manager, admin); those need a token (`allotd tokens create --user {user}`)",
        who.name()
    )))
}

impl Allocator {
    /// Groups from the top down to `name` (itself included); empty if unknown.
    fn path_of(&self, name: &str) -> Vec<String> {
        let tree = self.core.tree();
        tree.find(name)
            .map(|g| {
                tree.group(g)
                    .path
                    .iter()
                    .map(|p| tree.group(*p).name.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether `user` manages a group strictly above `name` (or `name` itself when
    /// `inclusive`).
    fn manages(&self, who: &Who, name: &str, inclusive: bool) -> bool {
        let Some(user) = role_user(who) else {
            return false;
        };
        let path = self.path_of(name);
        let upto = if inclusive {
            path.len()
        } else {
            path.len().saturating_sub(1)
        };
        path[..upto].iter().any(|g| {
            self.access
                .groups
                .get(g)
                .is_some_and(|a| a.managers.iter().any(|m| m == user))
        })
    }

    /// The projects `user` is named a member (or manager) of, on the project or a
    /// group above it; open groups do not count: a default project is one the
    /// user was given, not one anybody may charge.
    pub fn member_projects(&self, user: &str) -> Vec<String> {
        let tree = self.core.tree();
        tree.projects()
            .iter()
            .map(|&p| tree.group(p).name.clone())
            .filter(|p| {
                self.path_of(p).iter().any(|g| {
                    self.access.groups.get(g).is_some_and(|a| {
                        a.members.iter().any(|m| m == user) || a.managers.iter().any(|m| m == user)
                    })
                })
            })
            .collect()
    }

    fn may_charge(&self, user: &str, project: &str) -> bool {
        self.path_of(project).iter().any(|g| {
            self.access.groups.get(g).is_some_and(|a| {
                a.open
                    || a.members.iter().any(|m| m == user)
                    || a.managers.iter().any(|m| m == user)
            })
        })
    }

    /// Decides `ask` (`See`, `Cancel` or `Logs`) on workload `w`, held in memory or
    /// read back from the retired records.
    pub fn authorize_on(&self, who: &Who, ask: Ask<'_>, w: &super::WorkRec) -> Result<(), Denied> {
        if *who == Who::Anonymous || matches!(who, Who::Node(_)) {
            return self.authorize(who, Ask::Read);
        }
        if let Some(d) = self.vouch_refused(who) {
            return Err(d);
        }
        if self.access.admin(who) {
            return Ok(());
        }
        let me = who.name();
        let id = w.id;
        let u = who.user().unwrap_or_default();
        if matches!(ask, Ask::Attach(_)) {
            // A terminal is its owner's shell: an operator reads its output
            // (`allot logs`), never types into it.
            return if w.spec.user == u {
                Ok(())
            } else {
                Err(denied(format!(
                    "id: {me} may not attach to workload {id} of {}: only its owner (or an admin) may type into a session; `allot logs {id}` reads its output",
                    w.spec.user
                )))
            };
        }
        if matches!(ask, Ask::Logs(_)) {
            // Output may hold what its owner printed for themself: a manager sees
            // the workload, not what it wrote.
            return if w.spec.user == u || self.access.operator(who) {
                Ok(())
            } else {
                Err(denied(format!(
                    "id: {me} may not read the output of workload {id} of {}: only its owner, an operator ([roles] operators in allotd.toml) or an admin may",
                    w.spec.user
                )))
            };
        }
        if let Ask::Control {
            verb,
            operator_only,
            ..
        } = ask
        {
            let operator = self.access.operator(who);
            return if operator || (w.spec.user == u && !operator_only) {
                Ok(())
            } else if w.spec.user == u {
                Err(denied(format!(
                    "id: {me} may not {verb} workload {id}: only an operator ([roles] operators in allotd.toml) or an admin may; its owner may shorten its time limit, lower its priority and release their own hold"
                )))
            } else {
                Err(denied(format!(
                    "id: {me} may not {verb} workload {id} of {}: only its owner, an operator ([roles] operators in allotd.toml) or an admin may",
                    w.spec.user
                )))
            };
        }
        let owner_or_manager = w.spec.user == u || self.manages(who, &w.spec.project, true);
        let see = matches!(ask, Ask::See(_));
        if owner_or_manager || (see && self.access.operator(who)) {
            Ok(())
        } else {
            Err(denied(format!(
                "id: {me} may not {} workload {id} of {}: only its owner, a manager of {} or a group above it{}, or an admin may",
                if see { "see" } else { "cancel" },
                w.spec.user,
                w.spec.project,
                if see { ", an operator" } else { "" }
            )))
        }
    }

    /// Whether `who` may see the runs of `user`'s work in `project` (history, usage):
    /// their own; a manager's subtree; everything for operators.
    pub fn sees_run(&self, who: &Who, user: &str, project: &str) -> bool {
        self.access.operator(who)
            || who.user().is_some_and(|u| u == user)
            || self.manages(who, project, true)
    }

    /// Whether `who` manages some group (and so may see more than their own work).
    pub fn manages_any(&self, who: &Who) -> bool {
        role_user(who).is_some_and(|u| {
            self.access
                .groups
                .values()
                .any(|a| a.managers.iter().any(|m| m == u))
        })
    }

    /// Whether `who` is an operator (or an admin), whose holds only operators release.
    pub fn is_operator(&self, who: &Who) -> bool {
        self.access.operator(who)
    }

    /// Whether `who` may see workload `id`'s details (owner, a manager above its
    /// project, an operator).
    pub fn sees(&self, who: &Who, id: u64) -> bool {
        let Some(w) = self.work.get(&id) else {
            return false;
        };
        self.access.operator(who)
            || who.user().is_some_and(|u| w.spec.user == u)
            || self.manages(who, &w.spec.project, true)
    }

    /// Decides one request: `Ok` or the missing right.
    pub fn authorize(&self, who: &Who, ask: Ask<'_>) -> Result<(), Denied> {
        if *who == Who::Anonymous {
            return Err(Denied {
                unauthenticated: true,
                message: "authentication required: give a token (ALLOT_TOKEN or ~/.config/allot/token; an admin makes one with `allotd tokens create --user NAME`), or run allot on a host whose agent vouches for you".into(),
            });
        }
        if let Some(d) = self.vouch_refused(who) {
            return Err(d);
        }
        let admin = self.access.admin(who);
        let me = who.name();
        match ask {
            Ask::Session(node) | Ask::Renew(node) => match who {
                Who::Node(n) if n == node => Ok(()),
                Who::Node(n) => Err(denied(format!(
                    "node {n} may not act as node {node}: a node's certificate speaks for that node only"
                ))),
                _ => Err(denied(format!(
                    "{me} is not a node: agent sessions need an enrolled node's certificate (`allotd nodes enroll {node}`)"
                ))),
            },
            _ if admin => Ok(()),
            _ if matches!(who, Who::Node(_)) => Err(denied(format!(
                "{me} may only hold its agent session: user requests need a user (a token, or a user its agent vouches for)"
            ))),
            Ask::Admin => Err(no_role_vouched(who, "manage tokens or enrollment").unwrap_or_else(|| {
                denied(format!(
                    "{me} may not manage tokens or enrollment: needs the admin role ([roles] admins in allotd.toml)"
                ))
            })),
            Ask::Drain => {
                if let Some(d) = no_role_vouched(who, "drain or undrain nodes") {
                    Err(d)
                } else if self.access.operator(who) {
                    Ok(())
                } else {
                    Err(denied(format!(
                        "{me} may not drain or undrain nodes: needs the operator role ([roles] operators in allotd.toml)"
                    )))
                }
            }
            Ask::Read => Ok(()),
            Ask::Submit { project, user } => {
                let u = who.user().unwrap_or_default();
                if user != u {
                    return Err(denied(format!(
                        "user: {me} may submit only as themself, not as {user:?}; leave --user out"
                    )));
                }
                if self.may_charge(u, project) {
                    Ok(())
                } else {
                    Err(denied(format!(
                        "project: {me} may not charge {project:?}: not a member of it or of a group above it (members = [...] or open = true on its [[group]] in allotd.toml)"
                    )))
                }
            }
            Ask::See(id)
            | Ask::Cancel(id)
            | Ask::Logs(id)
            | Ask::Attach(id)
            | Ask::Control { id, .. } => match self.work.get(&id) {
                Some(w) => self.authorize_on(who, ask, w),
                // Unknown ids are the handler's NOT_FOUND (or a retired workload's
                // record, which it checks with `authorize_on`).
                None => Ok(()),
            },
            Ask::SetWeight(group) => {
                if let Some(d) = no_role_vouched(who, "set weights") {
                    return Err(d);
                }
                if self.manages(who, group, false) {
                    Ok(())
                } else {
                    Err(denied(format!(
                        "name: {me} may not set the weight of {group:?}: needs to be a manager of a group above it (managers = [...] on its parent's [[group]] in allotd.toml)"
                    )))
                }
            }
        }
    }

    /// Applies a credential input (see [`Input`]).
    pub(super) fn apply_creds(
        &mut self,
        at: Time,
        input: &Input,
        a: &mut Applied,
    ) -> Result<(), CoreError> {
        let c = &mut self.creds;
        match input {
            Input::TokenCreated {
                id,
                user,
                hash,
                expires,
                by,
                note,
            } => {
                c.tokens.insert(
                    id.clone(),
                    TokenRec {
                        id: id.clone(),
                        user: user.clone(),
                        hash: hash.clone(),
                        created: at,
                        expires: *expires,
                        revoked: false,
                        by: by.clone(),
                        note: note.clone(),
                    },
                );
                a.audit(0, 0, format!("token {id} for {user} created by {by}"));
            }
            Input::TokenRevoked { id, by } => {
                let t = c.tokens.get_mut(id).ok_or_else(|| {
                    CoreError::Config(format!(
                        "id: no token {id:?}; `allotd tokens list` shows them"
                    ))
                })?;
                t.revoked = true;
                a.audit(0, 0, format!("token {id} of {} revoked by {by}", t.user));
            }
            Input::NodeOffered {
                node,
                hash,
                expires,
                by,
            } => {
                let n = c.nodes.entry(node.clone()).or_default();
                n.offer = Some((hash.clone(), *expires));
                n.revoked = false;
                n.removed = false;
                n.by = by.clone();
                a.audit(0, 0, format!("node {node} offered enrollment by {by}"));
            }
            Input::NodeCertified {
                node,
                fingerprint,
                not_after,
            } => {
                let n = c.nodes.entry(node.clone()).or_default();
                n.offer = None;
                // Keep the newest and the one before (a renewal must not cut the
                // session that asked for it).
                n.certs.retain(|(_, exp)| *exp > at);
                n.certs.push((fingerprint.clone(), *not_after));
                let keep = n.certs.len().saturating_sub(2);
                n.certs.drain(..keep);
                a.audit(0, 0, format!("node {node} certified until {not_after}"));
            }
            Input::NodeRevoked { node, by } => {
                let n = c.nodes.get_mut(node).ok_or_else(|| {
                    CoreError::Config(format!("node: {node:?} was never enrolled"))
                })?;
                n.revoked = true;
                n.offer = None;
                n.certs.clear();
                n.by = by.clone();
                a.audit(0, 0, format!("node {node} revoked by {by}"));
            }
            _ => {}
        }
        Ok(())
    }

    /// The user a token proves at `now`.
    pub fn token_user(&self, secret: &str, now: Time) -> Result<String, Rejected> {
        self.creds.user_of(secret, now).map(str::to_string)
    }
}
