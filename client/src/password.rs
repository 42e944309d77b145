//! The keyed digests an auth server makes of an attempted password, to
//! send with a check or report: the daemon compares them for equality and
//! never sees the password, nor a hash that could be attacked offline.

/// The digest to pass as `password_digest`: keyed BLAKE2b of the account and
/// the attempted password, under a key only the auth server holds (32 bytes
/// of its own secret). The daemon sees neither the password nor a hash that
/// could be attacked offline, and only ever compares digests for equality.
pub fn password_digest(key: &[u8; 32], account: &str, password: &str) -> [u8; 16] {
    use blake2::digest::consts::U16;
    use blake2::digest::{FixedOutput, KeyInit, Update};
    let mut mac = blake2::Blake2bMac::<U16>::new_from_slice(key).expect("32-byte key fits BLAKE2b");
    mac.update(&(account.len() as u64).to_le_bytes());
    mac.update(account.as_bytes());
    mac.update(password.as_bytes());
    mac.finalize_fixed().into()
}

/// The tag to pass as `password_tag`: keyed BLAKE2b-128 of the attempted
/// password alone, under the same key as [`password_digest`] but with its
/// own personalization (`PASSWORD_TAG_PERSONAL`), so a tag cannot be
/// matched with a digest. Without the account, one password tried against
/// many accounts gives one tag: that is what lets the daemon see a spray.
/// The daemon re-keys it with its own secret and keeps failed tags in
/// memory only; anyone who reads its memory can tell that two failures used
/// the same password, never what the password is.
pub fn password_tag(key: &[u8; 32], password: &str) -> [u8; 16] {
    use blake2::digest::consts::U16;
    use blake2::digest::{FixedOutput, Update};
    let mut mac = blake2::Blake2bMac::<U16>::new_with_salt_and_personal(key, &[], PASSWORD_TAG_PERSONAL)
        .expect("a 32-byte key and a 15-byte personalization fit BLAKE2b");
    mac.update(password.as_bytes());
    mac.finalize_fixed().into()
}

/// BLAKE2b's personalization for [`password_tag`] (at most 16 bytes):
/// the same key and password give unrelated outputs here and in
/// [`password_digest`], which has none.
pub const PASSWORD_TAG_PERSONAL: &[u8] = b"tollgate-pw-tag";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_tag_depends_on_the_password_and_the_key_only() {
        let key = [7u8; 32];
        let tag = password_tag(&key, "hunter2");
        assert_eq!(tag, password_tag(&key, "hunter2"), "deterministic: one password, one tag");
        assert_ne!(tag, password_tag(&key, "hunter3"));
        assert_ne!(tag, password_tag(&[8u8; 32], "hunter2"), "keyed");
        // Not the digest, whatever the account, not even the empty one.
        for account in ["", "alice"] {
            assert_ne!(tag, password_digest(&key, account, "hunter2"));
        }
        // Not the unpersonalized MAC of the password alone either.
        use blake2::digest::consts::U16;
        use blake2::digest::{FixedOutput, KeyInit, Update};
        let mut plain = blake2::Blake2bMac::<U16>::new_from_slice(&key).unwrap();
        plain.update(b"hunter2");
        assert_ne!(tag, <[u8; 16]>::from(plain.finalize_fixed()));
    }
}
