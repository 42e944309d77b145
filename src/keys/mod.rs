//! Key derivation: every attacker-influenced identifier becomes a fixed-width
//! keyed digest before it reaches a table, the state file or a log.
//!
//! Written here rather than taken from a crate because it *is* the product:
//! the domain separation and the (account tag, tuple digest) layout below are
//! what let `unlock` find an account's entries without storing the account.

mod recent;

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blake2::digest::consts::{U16, U8};
use blake2::digest::{FixedOutput, Update};
use blake2::Blake2b;
use siphasher::sip128::{Hasher128, SipHasher13};

use self::recent::RecentDigests;
pub use self::recent::RECENT_DIGESTS_SLOTS;
use crate::source::PREFIX_BYTES;

/// Bytes of secret key material. 32 bytes is BLAKE2b's recommended key size
/// for 128-bit security of the digests.
pub const SECRET_BYTES: usize = 32;

/// A table key: a 128-bit keyed digest, split so that `account_tag` (the high
/// half) is the digest of the account alone whenever the key includes the
/// account. That lets an operator clear every (account, *) entry by scanning
/// for the tag, without any table holding the account.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Key {
    pub account_tag: u64,
    pub tuple: u64,
}

impl Key {
    pub fn to_u128(self) -> u128 {
        ((self.account_tag as u128) << 64) | self.tuple as u128
    }

    pub fn from_u128(value: u128) -> Key {
        Key { account_tag: (value >> 64) as u64, tuple: value as u64 }
    }

    /// The digest is uniformly distributed and unknown to an attacker without
    /// the secret, so its bits serve directly as a hash (no hash flooding).
    pub fn hash_bits(self) -> u64 {
        self.tuple
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.to_u128())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.to_u128())
    }
}

/// One part of a composite key. The discriminant is mixed into the digest so
/// that an account named like a device can never share a key with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    Prefix = 1,
    Account = 2,
    Device = 3,
    Tenant = 4,
    ClientId = 5,
}

impl Component {
    pub const ALL: [Component; 5] =
        [Component::Prefix, Component::Account, Component::Device, Component::Tenant, Component::ClientId];

    pub fn name(self) -> &'static str {
        match self {
            Component::Prefix => "prefix",
            Component::Account => "account",
            Component::Device => "device",
            Component::Tenant => "tenant",
            Component::ClientId => "client_id",
        }
    }

    pub fn parse(name: &str) -> Option<Component> {
        Component::ALL.into_iter().find(|c| c.name() == name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read secret key file {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot create secret key file {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("secret key file {path} is malformed: expected {expected} hex characters")]
    Malformed { path: PathBuf, expected: usize },
    #[error("secret key file {path} is readable by group or others (mode {mode:o}); chmod 600 it")]
    Exposed { path: PathBuf, mode: u32 },
}

/// The per-install secret key. Never printed: `Debug` hides it.
#[derive(Clone)]
pub struct Secret([u8; SECRET_BYTES]);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub fn from_bytes(bytes: [u8; SECRET_BYTES]) -> Secret {
        Secret(bytes)
    }

    /// Reads the secret (hex text), or creates it with mode 0600 on first start.
    pub fn load_or_create(path: &Path) -> Result<Secret, SecretError> {
        match Self::load(path)? {
            Some(secret) => Ok(secret),
            None => {
                let secret = Self::generate(path)?;
                secret.save(path)?;
                Ok(secret)
            }
        }
    }

    /// Reads the secret; `None` if the file does not exist.
    pub fn load(path: &Path) -> Result<Option<Secret>, SecretError> {
        match fs::read_to_string(path) {
            Ok(text) => {
                let mode = fs::metadata(path)
                    .map_err(|source| SecretError::Read { path: path.into(), source })?
                    .permissions()
                    .mode();
                if mode & 0o077 != 0 {
                    return Err(SecretError::Exposed { path: path.into(), mode: mode & 0o777 });
                }
                Self::parse_hex(text.trim())
                    .map(Some)
                    .ok_or(SecretError::Malformed { path: path.into(), expected: SECRET_BYTES * 2 })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SecretError::Read { path: path.into(), source }),
        }
    }

    /// A new random secret for `path` (not written yet: see `save`).
    pub fn generate(path: &Path) -> Result<Secret, SecretError> {
        let mut bytes = [0u8; SECRET_BYTES];
        getrandom::getrandom(&mut bytes)
            .map_err(|e| SecretError::Create { path: path.into(), source: io::Error::other(e.to_string()) })?;
        Ok(Secret(bytes))
    }

    /// Writes a new secret file with mode 0600; never replaces one.
    pub fn save(&self, path: &Path) -> Result<(), SecretError> {
        let create_err = |source| SecretError::Create { path: path.into(), source };
        // Written whole under a temporary name, then linked into place
        // (which, like `create_new`, fails if the file exists): a crash
        // leaves no secret file or a whole one, never an empty one that
        // every later start would refuse.
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(format!(".tmp-{}", std::process::id()));
        let temporary = std::path::PathBuf::from(temporary);
        let _ = std::fs::remove_file(&temporary);
        let mut file =
            OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temporary).map_err(create_err)?;
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        let written = file.write_all(format!("{hex}\n").as_bytes()).and_then(|()| file.sync_all());
        let linked = written.and_then(|()| std::fs::hard_link(&temporary, path));
        let _ = std::fs::remove_file(&temporary);
        linked.map_err(create_err)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(create_err)?;
        }
        Ok(())
    }

    /// What the state file records to tell which secret its digests were
    /// made with: a digest of the secret under a domain of its own, so it
    /// reveals nothing of the secret or of any table key.
    pub fn fingerprint(&self) -> u64 {
        let mut hash = Blake2b::<U8>::default();
        Update::update(&mut hash, FINGERPRINT_DOMAIN);
        Update::update(&mut hash, &self.0);
        u64::from_le_bytes(hash.finalize_fixed().into())
    }

    /// What a decision log records to tell whose digests it holds: the
    /// fingerprint under BLAKE2b keys (as logs always recorded), another
    /// value under another derivation, so a replay never mixes the two.
    pub fn digests_fingerprint(&self, derivation: Derivation) -> u64 {
        match derivation {
            Derivation::Blake2b => self.fingerprint(),
            other => {
                let mut hash = Blake2b::<U8>::default();
                Update::update(&mut hash, FINGERPRINT_DOMAIN);
                Update::update(&mut hash, &self.0);
                Update::update(&mut hash, &[other as u8]);
                u64::from_le_bytes(hash.finalize_fixed().into())
            }
        }
    }

    fn parse_hex(text: &str) -> Option<Secret> {
        if text.len() != SECRET_BYTES * 2 || !text.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; SECRET_BYTES];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Secret(bytes))
    }
}

type Mac = Blake2b<U16>;

/// BLAKE2b's block: the secret fills one whole block ahead of every input.
const BLOCK_BYTES: usize = 128;

/// How identifiers become table keys. A state file (and the shared store,
/// through its fingerprint) records the one its rows were made with: an
/// account's key under one is unrelated to its key under the other, so a
/// file keeps its derivation for life (see `Store::open_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Derivation {
    /// BLAKE2b-128 over (secret block || input), the last few thousand
    /// remembered: every file made before derivations were recorded.
    Blake2b = 1,
    /// Two SipHash-2-4 outputs, each under its own subkey of the secret:
    /// a new file's. A third of the time, and no memory of recent digests.
    SipHash = 2,
}

impl Derivation {
    /// What a new state file is made with.
    pub const NEWEST: Derivation = Derivation::SipHash;

    pub fn number(self) -> u64 {
        self as u64
    }

    pub fn from_number(number: u64) -> Option<Derivation> {
        match number {
            1 => Some(Derivation::Blake2b),
            2 => Some(Derivation::SipHash),
            _ => None,
        }
    }
}

/// Derives keys from identifiers, by one of two derivations (`Derivation`)
/// over the same inputs: a domain tag, the component, and a length prefix
/// (or a tuple's component digests), so the encoding is one-to-one.
///
/// A key only has to be unpredictable without the secret: then nobody can
/// aim an identifier at another's key, pick two that collide, or confirm a
/// guessed account against the state file or the store. A PRF under the
/// secret gives all three; collision resistance against someone who holds
/// the secret is not needed (they can unlock anyone already).
///
/// `SipHash`: the high and low halves are SipHash-2-4 (the PRF its
/// designers claim, 64-bit output, 128-bit key) under two subkeys made
/// from the secret with BLAKE2b, so independent; two independent PRFs side
/// by side are a PRF with 128-bit output. Chance collisions are as before:
/// the account tag was already 64 bits. An account's digest takes 71 ns
/// against BLAKE2b's 202 (`cargo bench --bench tables -- keys/`):
/// profiling put derivation at a third of a login's cost.
///
/// `Blake2b`: BLAKE2b-128 over (secret block || input): BLAKE2's keyed mode
/// is exactly a key block ahead of the data, and BLAKE2 has no length
/// extension, so this is a PRF under the secret. The prototype has already
/// compressed the secret block (it absorbed one byte past it), so each
/// digest of a short input costs a clone and a single compression.
///
/// Source prefixes take a cheaper keyed hash, SipHash-1-3 with a 128-bit
/// output under a subkey derived from the secret (password tags too, to 64
/// bits under a subkey of their own: see `password_tag`): a prefix is a fixed-width
/// network address, not an identifier (log lines show it in clear), so the
/// digest only has to be unpredictable, which keeps an attacker from aiming
/// at a shard or bucket. That is the job SipHash was designed for, at a
/// fifth of a BLAKE2b compression, and `request` checks are keyed on the
/// prefix alone (profiling put BLAKE2b at 15% of the daemon's time there).
///
/// Under `Blake2b`, the last few thousand digests are remembered
/// (`RecentDigests`) under a SipHash-1-3 tag of their whole input, keyed
/// by a third subkey: a report then finds the account and tuple digests
/// its check derived, for a tenth of their cost. The tag is 128 bits of a
/// keyed PRF, so two inputs share one only by chance (2^-128 a pair),
/// never by an attacker's choice; a digest recalled is the digest derived.
#[derive(Clone)]
pub struct KeyDeriver {
    derivation: Derivation,
    keyed: Mac,
    /// `SipHash`'s subkeys: the digest's high half, then its low half.
    halves_keys: [[u8; 16]; 2],
    prefix_key: [u8; 16],
    password_key: [u8; 16],
    recall_key: [u8; 16],
    /// `Blake2b` only. Shared by this deriver's clones (same secret, same
    /// digests).
    recent: Option<Arc<RecentDigests>>,
}

impl fmt::Debug for KeyDeriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyDeriver(..)")
    }
}

/// Domain of the secret's fingerprint (see `Secret::fingerprint`).
const FINGERPRINT_DOMAIN: &[u8] = b"tollgate secret key fingerprint v1";

/// First byte after the secret block: the digest scheme's version.
const TAG_VERSION: u8 = 0x01;
/// Domain tags: a component digest and a tuple digest can never collide.
const TAG_COMPONENT: u8 = 0xC0;
const TAG_TUPLE: u8 = 0x7E;
const TAG_PREFIX_SUBKEY: u8 = 0x5B;
const TAG_PASSWORD_SUBKEY: u8 = 0x9B;
const TAG_LOGGED: u8 = 0x1D;
const TAG_RECALL_SUBKEY: u8 = 0xA5;
const TAG_HIGH_HALF_SUBKEY: u8 = 0x2A;
const TAG_LOW_HALF_SUBKEY: u8 = 0x2B;

impl KeyDeriver {
    /// A deriver of the newest derivation (a new state file's).
    pub fn new(secret: &Secret) -> KeyDeriver {
        KeyDeriver::with_derivation(secret, Derivation::NEWEST)
    }

    pub fn with_derivation(secret: &Secret, derivation: Derivation) -> KeyDeriver {
        let mut block = [0u8; BLOCK_BYTES];
        block[..SECRET_BYTES].copy_from_slice(&secret.0);
        block[BLOCK_BYTES - 1] = SECRET_BYTES as u8;
        let mut keyed = <Mac as blake2::digest::Digest>::new();
        Update::update(&mut keyed, &block);
        Update::update(&mut keyed, &[TAG_VERSION]);
        let subkey = |tag: u8| {
            let mut subkey = keyed.clone();
            Update::update(&mut subkey, &[tag]);
            subkey.finalize_fixed().into()
        };
        KeyDeriver {
            derivation,
            halves_keys: [subkey(TAG_HIGH_HALF_SUBKEY), subkey(TAG_LOW_HALF_SUBKEY)],
            prefix_key: subkey(TAG_PREFIX_SUBKEY),
            password_key: subkey(TAG_PASSWORD_SUBKEY),
            recall_key: subkey(TAG_RECALL_SUBKEY),
            recent: (derivation == Derivation::Blake2b).then(|| Arc::new(RecentDigests::new())),
            keyed,
        }
    }

    pub fn derivation(&self) -> Derivation {
        self.derivation
    }

    /// Digest of a source prefix (its fixed-width bytes: family, length,
    /// address), as a component.
    pub fn prefix(&self, bytes: &[u8; PREFIX_BYTES]) -> [u8; 16] {
        use std::hash::Hasher;
        // One write of the whole input: the same digest as writing the tag
        // and the bytes in turn, without the hasher buffering a 1-byte tail.
        let mut input = [0u8; 1 + PREFIX_BYTES];
        input[0] = Component::Prefix as u8;
        input[1..].copy_from_slice(bytes);
        let mut hasher = SipHasher13::new_with_key(&self.prefix_key);
        hasher.write(&input);
        hasher.finish128().as_bytes()
    }

    /// A digest of a fixed input: two derivers with the same value derive
    /// the same prefix digests (spray detection's thread and the request
    /// path must, or a flag is raised on a digest nobody probes).
    pub fn prefix_check(&self) -> [u8; 16] {
        self.prefix(&[0; PREFIX_BYTES])
    }

    /// Digest of one component. Length-prefixed so ("ab","c") != ("a","bc").
    pub fn component(&self, component: Component, bytes: &[u8]) -> [u8; 16] {
        self.digest(&[&[TAG_COMPONENT, component as u8], &(bytes.len() as u64).to_le_bytes(), bytes])
    }

    /// The digest of the pieces in turn: under `SipHash` its two halves;
    /// under `Blake2b`, BLAKE2b-128 of (secret block || version || the
    /// pieces), recalled if it was derived lately.
    fn digest(&self, pieces: &[&[u8]]) -> [u8; 16] {
        let Some(recent) = &self.recent else {
            return self.halves(pieces);
        };
        let tag = self.recall_tag(pieces);
        if let Some(digest) = recent.recall(tag) {
            return digest;
        }
        let digest = self.derived(pieces);
        recent.remember(tag, &digest);
        digest
    }

    /// `SipHash`'s digest: SipHash-2-4 of the pieces under each half's
    /// subkey.
    fn halves(&self, pieces: &[&[u8]]) -> [u8; 16] {
        // Joined once for both halves.
        let mut buffer = [0u8; PIECES_INLINE];
        let (high, low) = match joined(pieces, &mut buffer) {
            Some(input) => (self.half(0, &[input]), self.half(1, &[input])),
            None => (self.half(0, pieces), self.half(1, pieces)),
        };
        let mut digest = [0u8; 16];
        digest[..8].copy_from_slice(&high.to_le_bytes());
        digest[8..].copy_from_slice(&low.to_le_bytes());
        digest
    }

    /// One half of `SipHash`'s digest (0 high, 1 low).
    fn half(&self, which: usize, pieces: &[&[u8]]) -> u64 {
        use std::hash::Hasher;
        let mut hasher = siphasher::sip::SipHasher24::new_with_key(&self.halves_keys[which]);
        write_pieces(&mut hasher, pieces);
        hasher.finish()
    }

    /// The tag a digest of these pieces is remembered under.
    fn recall_tag(&self, pieces: &[&[u8]]) -> u128 {
        let mut hasher = SipHasher13::new_with_key(&self.recall_key);
        write_pieces(&mut hasher, pieces);
        hasher.finish128().as_u128()
    }

    /// `digest` always derived, never recalled.
    fn derived(&self, pieces: &[&[u8]]) -> [u8; 16] {
        let mut mac = self.keyed.clone();
        for piece in pieces {
            mac.update(piece);
        }
        mac.finalize_fixed().into()
    }

    /// Key for a tuple of component digests, given in the rule's order.
    /// A one-component key is that component's digest; a longer tuple is one
    /// more MAC over the digests. When the account is part of the tuple its
    /// digest's high half becomes the key's `account_tag`.
    pub fn tuple(&self, parts: &[(Component, [u8; 16])]) -> Key {
        let digest = match parts {
            [(_, only)] => *only,
            _ if parts.len() > Component::ALL.len() => {
                // A component twice (no rule's key has one): piece by piece.
                let mut pieces: Vec<&[u8]> = Vec::with_capacity(1 + 2 * parts.len());
                let head = [TAG_TUPLE, parts.len() as u8];
                let tags: Vec<[u8; 1]> = parts.iter().map(|(c, _)| [*c as u8]).collect();
                pieces.push(&head);
                for ((_, digest), tag) in parts.iter().zip(&tags) {
                    pieces.push(tag);
                    pieces.push(digest);
                }
                match self.derivation {
                    Derivation::SipHash => self.halves(&pieces),
                    Derivation::Blake2b => self.derived(&pieces),
                }
            }
            _ => {
                // One piece: the tag, the count, then each (component, digest).
                let mut input = [0u8; TUPLE_INPUT_MAX];
                input[..2].copy_from_slice(&[TAG_TUPLE, parts.len() as u8]);
                for (i, (component, digest)) in parts.iter().enumerate() {
                    input[2 + 17 * i] = *component as u8;
                    input[3 + 17 * i..2 + 17 * (i + 1)].copy_from_slice(digest);
                }
                let input = &input[..2 + 17 * parts.len()];
                match parts.iter().find(|(c, _)| *c == Component::Account) {
                    // The account's tag takes the high half's place below:
                    // only the low half is derived.
                    Some((_, account)) if self.derivation == Derivation::SipHash => {
                        return Key { account_tag: account_tag_of(account), tuple: self.half(1, &[input]) };
                    }
                    _ => self.digest(&[input]),
                }
            }
        };
        let mut key = split(&digest);
        if let Some((_, account)) = parts.iter().find(|(c, _)| *c == Component::Account) {
            key.account_tag = split(account).account_tag;
        }
        key
    }

    /// A client's password tag (its keyed digest of the password alone)
    /// re-keyed with this daemon's secret to 64 bits: the key spray
    /// detection files a password under (its index slot, its flag).
    /// SipHash-1-3 under a subkey of the secret, as for prefixes: the
    /// value lives only in this process's memory (spray detection is
    /// neither saved nor shared), so it needs to be a PRF, not a stored
    /// name. Any client may send any 16 bytes and `status` shows flagged
    /// values, so it rests on the secret key alone: without it no one can
    /// aim passwords at one slot or make two collide. Every report that
    /// carries a tag pays for it, at a tenth of a BLAKE2b compression.
    pub fn password_tag(&self, tag: &[u8; 16]) -> u64 {
        use std::hash::Hasher;
        let mut hasher = siphasher::sip::SipHasher13::new_with_key(&self.password_key);
        hasher.write(tag);
        hasher.finish()
    }

    /// A client's password digest or tag re-keyed with this daemon's
    /// secret under a domain of its own, for the decision log: consistent
    /// within one secret (all replay needs), and equal to nothing the
    /// tables hold. `what` separates the digest from the tag.
    pub fn logged(&self, what: u8, value: &[u8; 16]) -> [u8; 16] {
        self.derived(&[&[TAG_LOGGED, what], value])
    }

    /// The `account_tag` every key containing this account carries.
    pub fn account_tag(&self, account: &str) -> u64 {
        account_tag_of(&self.component(Component::Account, account.as_bytes()))
    }
}

/// Pieces of a SipHash input up to this length are hashed in one write.
const PIECES_INLINE: usize = 128;

/// Writes the pieces in turn: in one write when they fit, the same hash
/// (SipHash reads its input as one string) without the hasher buffering
/// each piece's tail, which costs more than the copy.
fn write_pieces(hasher: &mut impl std::hash::Hasher, pieces: &[&[u8]]) {
    let mut buffer = [0u8; PIECES_INLINE];
    match joined(pieces, &mut buffer) {
        Some(input) => hasher.write(input),
        None => {
            for piece in pieces {
                hasher.write(piece);
            }
        }
    }
}

/// The pieces as one input: a lone piece as it is, several copied into
/// `buffer` when they fit; `None` when they do not.
fn joined<'a>(pieces: &[&'a [u8]], buffer: &'a mut [u8; PIECES_INLINE]) -> Option<&'a [u8]> {
    if let [only] = pieces {
        return Some(only);
    }
    let len: usize = pieces.iter().map(|p| p.len()).sum();
    if len > buffer.len() {
        return None;
    }
    let mut at = 0;
    for piece in pieces {
        buffer[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    }
    Some(&buffer[..len])
}

/// A tuple's digest input at most: its tag and count, then a component
/// byte and a digest for each component, every one at most once.
const TUPLE_INPUT_MAX: usize = 2 + 17 * Component::ALL.len();

/// The `account_tag` of an account's component digest.
pub fn account_tag_of(account: &[u8; 16]) -> u64 {
    split(account).account_tag
}

fn split(digest: &[u8; 16]) -> Key {
    let mut hi = [0u8; 8];
    let mut lo = [0u8; 8];
    hi.copy_from_slice(&digest[..8]);
    lo.copy_from_slice(&digest[8..]);
    Key { account_tag: u64::from_le_bytes(hi), tuple: u64::from_le_bytes(lo) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deriver(seed: u8) -> KeyDeriver {
        KeyDeriver::new(&Secret::from_bytes([seed; SECRET_BYTES]))
    }

    fn blake2b_deriver(seed: u8) -> KeyDeriver {
        KeyDeriver::with_derivation(&Secret::from_bytes([seed; SECRET_BYTES]), Derivation::Blake2b)
    }

    #[test]
    fn digests_depend_on_secret_component_and_boundaries() {
        for d in [deriver(1), blake2b_deriver(1)] {
            let other = KeyDeriver::with_derivation(&Secret::from_bytes([2; SECRET_BYTES]), d.derivation());
            digests_depend_on_secret_component_and_boundaries_under(&d, &other);
        }
        // The two derivations of one input are unrelated.
        assert_ne!(
            deriver(1).component(Component::Account, b"alice"),
            blake2b_deriver(1).component(Component::Account, b"alice")
        );
    }

    fn digests_depend_on_secret_component_and_boundaries_under(d: &KeyDeriver, other: &KeyDeriver) {
        let a = d.component(Component::Account, b"alice");
        assert_eq!(a, d.component(Component::Account, b"alice"));
        assert_ne!(a, other.component(Component::Account, b"alice"));
        assert_ne!(a, d.component(Component::Device, b"alice"));
        let ab_c = d.tuple(&[
            (Component::Account, d.component(Component::Account, b"ab")),
            (Component::Device, d.component(Component::Device, b"c")),
        ]);
        let a_bc = d.tuple(&[
            (Component::Account, d.component(Component::Account, b"a")),
            (Component::Device, d.component(Component::Device, b"bc")),
        ]);
        assert_ne!(ab_c, a_bc);
    }

    #[test]
    fn prefix_digests_depend_on_secret_and_input_only() {
        let d = deriver(4);
        let bytes = |last: u8| {
            let mut b = [0u8; PREFIX_BYTES];
            b[..6].copy_from_slice(&[4, 24, 198, 51, 100, last]);
            b
        };
        let a = d.prefix(&bytes(0));
        assert_eq!(a, deriver(4).prefix(&bytes(0)));
        assert_ne!(a, deriver(5).prefix(&bytes(0)));
        assert_ne!(a, d.prefix(&bytes(1)));
        // A prefix's digest is not the BLAKE2b component digest of the same bytes.
        assert_ne!(a, d.component(Component::Prefix, &bytes(0)));
    }

    #[test]
    fn prefix_digests_are_those_already_in_state_files() {
        // Persisted counters are keyed by these digests: the one-write form
        // must equal the tag-then-bytes form the state files were made with.
        use std::hash::Hasher;
        let d = deriver(6);
        for last in [0u8, 7, 255] {
            let mut bytes = [last; PREFIX_BYTES];
            bytes[0] = 6;
            let mut hasher = SipHasher13::new_with_key(&d.prefix_key);
            hasher.write_u8(Component::Prefix as u8);
            hasher.write(&bytes);
            assert_eq!(d.prefix(&bytes), hasher.finish128().as_bytes());
        }
    }

    #[test]
    fn the_digests_state_files_and_the_store_hold_do_not_change() {
        // Lockouts, counters and store keys are these digests: a change to
        // any derivation below would orphan every saved one. Values made
        // by the build that wrote this test, and by the one before it.
        let d = deriver(6);
        let mut bytes = [7u8; PREFIX_BYTES];
        bytes[0] = 6;
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let prefix = d.prefix(&bytes);
        // Each twice: derived, then recalled.
        let b = blake2b_deriver(6);
        for _ in 0..2 {
            let account = b.component(Component::Account, b"alice");
            assert_eq!(hex(&prefix), "316f251e096abdd2f7b0e67da93cf331");
            assert_eq!(hex(&account), "6afee3d8447aa31a14bb98ac809f09be");
            let key = b.tuple(&[(Component::Account, account), (Component::Prefix, prefix)]);
            assert_eq!(key.to_string(), "1aa37a44d8e3fe6a067a9f8e2a45f53d");
        }
        assert_eq!(b.prefix(&bytes), prefix, "prefixes are keyed alike under both derivations");
        let account = d.component(Component::Account, b"alice");
        assert_eq!(hex(&account), "db25f1e7c69af5e733cf0395a561e324");
        let key = d.tuple(&[(Component::Account, account), (Component::Prefix, prefix)]);
        assert_eq!(key.to_string(), "e7f59ac6e7f125db3e167cc021293e2a");
    }

    #[test]
    fn siphash_digests_of_every_input_shape_do_not_change() {
        // The shapes the test above leaves out: an empty identifier, the
        // longest joined into one write (118 bytes), the shortest written
        // piece by piece (119), a long one, and a tuple without an account
        // (both halves derived). Values made by the build before a digest's
        // pieces were joined once for both halves.
        let d = deriver(6);
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let account = |len: usize| hex(&d.component(Component::Account, &vec![b'a'; len]));
        let mut bytes = [7u8; PREFIX_BYTES];
        bytes[0] = 6;
        let device = d.component(Component::Device, b"phone");
        let key = d.tuple(&[(Component::Prefix, d.prefix(&bytes)), (Component::Device, device)]);
        let got = [account(0), account(118), account(119), account(300), key.to_string()];
        assert_eq!(
            got,
            [
                "f7555b457dfd156b3b4d1dcb1eced67a",
                "8884745af05281a39a10c79326455514",
                "ca7504a22eeb694d9abc54ff71955b49",
                "359328cbdc4bdb400116b3d027baf669",
                "d7b318fe1678ffebd402b52632b1da89",
            ]
        );
    }

    #[test]
    fn a_siphash_digest_is_siphash_2_4_of_the_whole_input_under_each_halfs_subkey() {
        // Written here rather than trusted to the one-write shortcut: the
        // input of a long identifier goes piece by piece, a short one in
        // one write, and both must be SipHash-2-4 of the concatenation.
        use std::hash::Hasher;
        // The crate is SipHash-2-4: the paper's test vector (appendix A).
        let mut paper = siphasher::sip::SipHasher24::new_with_key(&std::array::from_fn(|i| i as u8));
        paper.write(&std::array::from_fn::<u8, 15, _>(|i| i as u8));
        assert_eq!(paper.finish(), 0xa129ca6149be45e5);
        let d = deriver(8);
        for name in [&b"alice"[..], &[b'x'; 100][..], &[b'y'; 300][..]] {
            let mut input = vec![TAG_COMPONENT, Component::Account as u8];
            input.extend((name.len() as u64).to_le_bytes());
            input.extend(name);
            let half = |key: &[u8; 16]| {
                let mut hasher = siphasher::sip::SipHasher24::new_with_key(key);
                for byte in &input {
                    hasher.write_u8(*byte);
                }
                hasher.finish().to_le_bytes()
            };
            let digest = d.component(Component::Account, name);
            assert_eq!(digest[..8], half(&d.halves_keys[0]), "{} bytes", name.len());
            assert_eq!(digest[8..], half(&d.halves_keys[1]), "{} bytes", name.len());
        }
        assert_ne!(d.halves_keys[0], d.halves_keys[1]);
        assert!(d.recent.is_none(), "SipHash digests are not remembered");
    }

    #[test]
    fn a_recalled_digest_is_the_digest_derived() {
        // Two secrets' derivers (each with its own table), inputs that
        // repeat and crowd each other out of their slots, and one account
        // with two prefixes: every answer is the digest derived afresh,
        // and repeats are answered from memory.
        let (a, b) = (blake2b_deriver(1), blake2b_deriver(2));
        let mut recalled = 0;
        for i in 0..20_000u32 {
            // Each name twice in a row (a check, then its report), and
            // 10,000 names in all: more than the slots hold.
            let name = format!("user{}", i / 2);
            for d in [&a, &b] {
                let pieces: [&[u8]; 3] = [&[TAG_COMPONENT, 2], &(name.len() as u64).to_le_bytes(), name.as_bytes()];
                recalled += d.recent.as_ref().unwrap().recall(d.recall_tag(&pieces)).is_some() as u32;
                let account = d.component(Component::Account, name.as_bytes());
                assert_eq!(account, d.derived(&pieces));
                for network in [i / 2, i / 2 + 1] {
                    let mut bytes = [0u8; PREFIX_BYTES];
                    bytes[..4].copy_from_slice(&network.to_le_bytes());
                    let prefix = d.prefix(&bytes);
                    let key = d.tuple(&[(Component::Account, account), (Component::Prefix, prefix)]);
                    let mut input = vec![TAG_TUPLE, 2, Component::Account as u8];
                    input.extend(account);
                    input.push(Component::Prefix as u8);
                    input.extend(prefix);
                    let mut expected = split(&d.derived(&[&input]));
                    expected.account_tag = account_tag_of(&account);
                    assert_eq!(key, expected, "{name} from network {network}");
                }
            }
        }
        assert!(recalled > 15_000, "only {recalled} of the 20,000 repeats recalled");
    }

    #[test]
    fn password_tags_depend_on_secret_and_input_under_their_own_subkey() {
        let (a, b) = (deriver(6), deriver(7));
        assert_eq!(a.password_tag(&[9; 16]), a.clone().password_tag(&[9; 16]));
        assert_ne!(a.password_tag(&[9; 16]), b.password_tag(&[9; 16]));
        assert_ne!(a.password_tag(&[9; 16]), a.password_tag(&[8; 16]));
        assert_ne!(a.password_key, a.prefix_key);
    }

    #[test]
    fn account_tag_is_shared_by_every_key_with_the_account() {
        let d = deriver(3);
        let account = d.component(Component::Account, b"alice");
        let prefix_a = d.prefix(&[1; PREFIX_BYTES]);
        let prefix_b = d.prefix(&[2; PREFIX_BYTES]);
        let k1 = d.tuple(&[(Component::Account, account), (Component::Prefix, prefix_a)]);
        let k2 = d.tuple(&[(Component::Account, account), (Component::Prefix, prefix_b)]);
        assert_eq!(k1.account_tag, d.account_tag("alice"));
        assert_eq!(k2.account_tag, d.account_tag("alice"));
        assert_ne!(k1.tuple, k2.tuple);
        assert_eq!(Key::from_u128(k1.to_u128()), k1);
    }

    #[test]
    fn secret_file_is_created_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let created = Secret::load_or_create(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let read = Secret::load_or_create(&path).unwrap();
        assert_eq!(created.0, read.0);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(Secret::load_or_create(&path), Err(SecretError::Exposed { .. })));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, "zz").unwrap();
        assert!(matches!(Secret::load_or_create(&path), Err(SecretError::Malformed { .. })));
    }

    #[test]
    fn the_fingerprint_tells_secrets_apart_and_is_not_a_table_key() {
        let a = Secret::from_bytes([1; SECRET_BYTES]);
        assert_eq!(a.fingerprint(), Secret::from_bytes([1; SECRET_BYTES]).fingerprint());
        assert_ne!(a.fingerprint(), Secret::from_bytes([2; SECRET_BYTES]).fingerprint());
        let component = deriver(1).component(Component::Account, b"");
        assert_ne!(a.fingerprint().to_le_bytes(), component[..8]);
        // A decision log's: the fingerprint for BLAKE2b keys, else another.
        assert_eq!(a.digests_fingerprint(Derivation::Blake2b), a.fingerprint());
        assert_ne!(a.digests_fingerprint(Derivation::SipHash), a.fingerprint());
    }
}
