//! Words for a request bincode refused: the body is walked field by field
//! to name the first field that does not fit. Only a refused body is
//! walked, so none of this runs on a well-formed request.

use crate::protocol::{ABANDON_VERSION, ACTIVITY_VERSION, BAN_VERSION, INSPECT_VERSION, SIGNALS_VERSION};

/// Why a request body bincode refused does not decode, by field, in the
/// order bincode reads it: `Err` with the first problem. Only a refused body
/// is walked, so this costs the fast path nothing; the request layouts are
/// PROTOCOL.md's section 5. `Ok` means the walk found nothing wrong (the
/// caller then falls back to `plain_decode_error`). The trailing bytes are
/// not the walker's: `decode_request_general` counts them.
pub(super) fn describe_bad_request(version: u8, body: &[u8]) -> Result<(), String> {
    let mut body = Walker(body);
    let tagged = version >= SIGNALS_VERSION;
    match body.u32("the request tag")? {
        0 => {
            body.str("route")?;
            body.subject()?;
            if tagged {
                body.password_tag()?;
            }
            Ok(())
        }
        1 => {
            body.str("route")?;
            body.subject()?;
            match body.u32("field `outcome`")? {
                0 | 1 => {}
                other => return Err(format!("outcome {other} is not 0 (success) or 1 (failure)")),
            }
            if body.option_tag("password_digest")? {
                body.take(16, "field `password_digest`")?;
            }
            if tagged {
                body.password_tag()?;
            }
            Ok(())
        }
        2 => Ok(()),
        3 => body.take(4, "field `limit`").map(drop),
        4 => {
            body.str("route")?;
            body.str("account")?;
            body.optional_ip("source")
        }
        5 => body.take(8, "field `by_ms`").map(drop),
        6 | 7 if version >= ACTIVITY_VERSION => body.take(4, "field `limit`").map(drop),
        8 if version >= ABANDON_VERSION => {
            body.str("route")?;
            body.subject()
        }
        9 if version >= INSPECT_VERSION => {
            body.str("route")?;
            body.subject()
        }
        10 if version >= BAN_VERSION => {
            body.ip("network")?;
            body.take(1, "field `prefix_len`")?;
            body.take(8, "field `for_ms`")?;
            body.str("reason")
        }
        11 if version >= BAN_VERSION => {
            body.ip("network")?;
            body.take(1, "field `prefix_len`").map(drop)
        }
        other => {
            let last = match version {
                v if v >= BAN_VERSION => 11,
                v if v >= INSPECT_VERSION => 9,
                v if v >= ABANDON_VERSION => 8,
                v if v >= ACTIVITY_VERSION => 7,
                _ => 5,
            };
            Err(format!("unknown request tag {other} (the known tags are 0 to {last})"))
        }
    }
}

/// A request body read for `describe_bad_request`: each read names the
/// field it is in when the bytes do not fit.
struct Walker<'b>(&'b [u8]);

impl<'b> Walker<'b> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'b [u8], String> {
        if self.0.len() < n {
            return Err(format!("message ends inside {what}: {n} bytes needed, {} left", self.0.len()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    fn str(&mut self, field: &str) -> Result<(), String> {
        let len = u64::from_le_bytes(self.take(8, &format!("the length of field `{field}`"))?.try_into().expect("8"));
        let left = self.0.len();
        let bytes = match usize::try_from(len) {
            Ok(len) if len <= left => self.take(len, field)?,
            _ => return Err(format!("field `{field}` claims {len} bytes, but only {left} are left")),
        };
        std::str::from_utf8(bytes)
            .map(drop)
            .map_err(|e| format!("string not UTF-8 in field `{field}` (at byte {} of it)", e.valid_up_to()))
    }

    /// An `Option`'s tag: whether a value follows.
    fn option_tag(&mut self, field: &str) -> Result<bool, String> {
        match self.take(1, &format!("the option tag of field `{field}`"))?[0] {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(format!("option tag {other} in field `{field}` is not 0 (none) or 1 (some)")),
        }
    }

    fn optional_ip(&mut self, field: &str) -> Result<(), String> {
        if !self.option_tag(field)? {
            return Ok(());
        }
        self.ip(field)
    }

    fn ip(&mut self, field: &str) -> Result<(), String> {
        let octets = match self.u32(&format!("the address family of field `{field}`"))? {
            0 => 4,
            1 => 16,
            other => return Err(format!("address family {other} in field `{field}` is not 0 (IPv4) or 1 (IPv6)")),
        };
        self.take(octets, &format!("field `{field}`")).map(drop)
    }

    /// Version 3's trailing `Option<[u8; 16]>` of a check or report.
    fn password_tag(&mut self) -> Result<(), String> {
        if self.option_tag("password_tag")? {
            self.take(16, "field `password_tag`")?;
        }
        Ok(())
    }

    fn subject(&mut self) -> Result<(), String> {
        self.optional_ip("subject.peer")?;
        for field in ["forwarded_for", "account", "device", "tenant", "client_id"] {
            let field = format!("subject.{field}");
            if self.option_tag(&field)? {
                self.str(&field)?;
            }
        }
        Ok(())
    }
}
