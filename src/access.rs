//! Who may ask what, by the peer's credentials (SO_PEERCRED), not by who
//! can reach the socket: `check`/`report` for the configured clients, admin
//! operations for root, the daemon's own user, or the configured admins.
//! Names are resolved once, at start (a reload keeps them: `[server]`
//! changes need a restart).

use crate::config::ServerConfig;

/// What one connection's peer may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permissions {
    pub attempts: bool,
    pub admin: bool,
}

/// Resolved user and group ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    daemon_uid: u32,
    client_uids: Vec<u32>,
    client_gids: Vec<u32>,
    admin_uids: Vec<u32>,
    admin_gids: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
#[error("server.{field}: no such {kind} `{name}`")]
pub struct UnknownName {
    field: &'static str,
    kind: &'static str,
    name: String,
}

fn resolve(
    field: &'static str,
    names: &[String],
    kind: &'static str,
    lookup: impl Fn(&str) -> Option<u32>,
) -> Result<Vec<u32>, UnknownName> {
    names
        .iter()
        .map(|name| {
            name.parse::<u32>().ok().or_else(|| lookup(name)).ok_or(UnknownName { field, kind, name: name.clone() })
        })
        .collect()
}

pub fn user_id(name: &str) -> Option<u32> {
    nix::unistd::User::from_name(name).ok().flatten().map(|u| u.uid.as_raw())
}

pub fn group_id(name: &str) -> Option<u32> {
    nix::unistd::Group::from_name(name).ok().flatten().map(|g| g.gid.as_raw())
}

impl Access {
    /// Resolves the configured names (reads the user and group databases).
    pub fn resolve(server: &ServerConfig, daemon_uid: u32) -> Result<Access, UnknownName> {
        Ok(Access {
            daemon_uid,
            client_uids: resolve("client_users", &server.client_users, "user", user_id)?,
            client_gids: resolve("client_groups", &server.client_groups, "group", group_id)?,
            admin_uids: resolve("admin_users", &server.admin_users, "user", user_id)?,
            admin_gids: resolve("admin_groups", &server.admin_groups, "group", group_id)?,
        })
    }

    /// The permissions of a peer with this uid and (primary) gid.
    pub fn of(&self, uid: u32, gid: u32) -> Permissions {
        let admin =
            uid == 0 || uid == self.daemon_uid || self.admin_uids.contains(&uid) || self.admin_gids.contains(&gid);
        let open = self.client_uids.is_empty() && self.client_gids.is_empty();
        let attempts = admin || open || self.client_uids.contains(&uid) || self.client_gids.contains(&gid);
        Permissions { attempts, admin }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(client_users: &[&str], admin_groups: &[&str]) -> ServerConfig {
        let mut s = crate::config::Config::default().server;
        s.client_users = client_users.iter().map(|s| s.to_string()).collect();
        s.admin_groups = admin_groups.iter().map(|s| s.to_string()).collect();
        s
    }

    #[test]
    fn root_and_the_daemon_are_admins_and_lists_narrow_clients() {
        let open = Access::resolve(&server(&[], &[]), 990).unwrap();
        assert_eq!(open.of(0, 0), Permissions { attempts: true, admin: true });
        assert_eq!(open.of(990, 990), Permissions { attempts: true, admin: true });
        assert_eq!(open.of(1000, 1000), Permissions { attempts: true, admin: false });

        let narrow = Access::resolve(&server(&["1000"], &["4000"]), 990).unwrap();
        assert_eq!(narrow.of(1000, 1000), Permissions { attempts: true, admin: false });
        assert_eq!(narrow.of(1001, 1001), Permissions { attempts: false, admin: false });
        assert_eq!(narrow.of(1002, 4000), Permissions { attempts: true, admin: true });
        assert!(Access::resolve(&server(&["root"], &[]), 990).unwrap().of(0, 0).attempts);
    }

    #[test]
    fn unknown_names_are_refused_by_name() {
        let err = Access::resolve(&server(&["no-such-user-x1"], &[]), 990).unwrap_err();
        assert_eq!(err.to_string(), "server.client_users: no such user `no-such-user-x1`");
    }
}
