package dev.tollgate.client;

import java.net.InetAddress;

/**
 * Who is attempting a login; every field may be null (absent). Pass the raw
 * X-Forwarded-For header and the TCP peer: the daemon picks the source
 * itself. Identifiers over 512 UTF-8 bytes are refused (field_too_long)
 * before anything is sent, never truncated; so is (malformed) a string
 * with an unpaired surrogate, which has no UTF-8 form.
 */
public record Subject(
        InetAddress peer,
        String forwardedFor,
        String account,
        String device,
        String tenant,
        String clientId) {

    public static final Subject EMPTY = new Subject(null, null, null, null, null, null);

    /** The common login subject: the TCP peer and the account as typed. */
    public static Subject of(InetAddress peer, String account) {
        return new Subject(peer, null, account, null, null, null);
    }

    public Subject withPeer(InetAddress value) {
        return new Subject(value, forwardedFor, account, device, tenant, clientId);
    }

    public Subject withForwardedFor(String value) {
        return new Subject(peer, value, account, device, tenant, clientId);
    }

    public Subject withAccount(String value) {
        return new Subject(peer, forwardedFor, value, device, tenant, clientId);
    }

    public Subject withDevice(String value) {
        return new Subject(peer, forwardedFor, account, value, tenant, clientId);
    }

    public Subject withTenant(String value) {
        return new Subject(peer, forwardedFor, account, device, value, clientId);
    }

    public Subject withClientId(String value) {
        return new Subject(peer, forwardedFor, account, device, tenant, value);
    }

    /** The subject as sent: of X-Forwarded-For only the part the daemon reads. */
    Subject bounded() {
        if (forwardedFor == null) return this;
        String tail = ForwardedFor.tail(forwardedFor);
        return tail.equals(forwardedFor) ? this : withForwardedFor(tail);
    }
}
