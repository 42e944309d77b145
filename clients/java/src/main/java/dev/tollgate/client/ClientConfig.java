package dev.tollgate.client;

import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;

/** A client's settings; {@link #of} gives the Rust client's defaults. Not thread-safe: build it, then hand it to {@link Client}. */
public final class ClientConfig {
    /** Per call: a stalled daemon costs a login no more than a few ms before the fail policy decides. */
    public static final Duration TIMEOUT_DEFAULT = Duration.ofMillis(5);
    /**
     * How long a run of timeouts from a daemon that has answered is taken for
     * a busy daemon, not a lost one, and how long after an answer (in time,
     * or late on a timed-out call's connection, which is listened on for
     * this long) the daemon still counts as answering.
     */
    public static final Duration BUSY_MAX_DEFAULT = Duration.ofSeconds(1);

    Path socket;
    Duration timeout = TIMEOUT_DEFAULT;
    Duration busyMax = BUSY_MAX_DEFAULT;
    int protocolVersion = Codec.PROTOCOL_VERSION;
    final Map<String, FailPolicy> failPolicies = new HashMap<>(FailPolicy.BUILTIN);
    FailPolicy defaultFailPolicy = FailPolicy.OPEN;
    final Map<String, Gcra.Spec> staticBudgets = new HashMap<>();

    private ClientConfig(Path socket) {
        this.socket = socket;
    }

    /** The built-in routes' fail policies (unknown routes open), the 5 ms timeout, busy_max 1 s, protocol version 5. */
    public static ClientConfig of(Path socket) {
        return new ClientConfig(socket);
    }

    public static ClientConfig of(String socket) {
        return new ClientConfig(Path.of(socket));
    }

    public ClientConfig timeout(Duration value) {
        timeout = value;
        return this;
    }

    /** Zero: every timeout is an outage for the fail policy, and no timed-out call's connection is listened on. */
    public ClientConfig busyMax(Duration value) {
        busyMax = value;
        return this;
    }

    /** The version sent on a new connection (1 to 5); a connection whose daemon refuses it steps down by itself. */
    public ClientConfig protocolVersion(int version) {
        if (version < Codec.PROTOCOL_VERSION_MIN || version > Codec.PROTOCOL_VERSION) {
            throw new IllegalArgumentException("protocol version " + version + " is not one this client speaks (1 to 5)");
        }
        protocolVersion = version;
        return this;
    }

    public ClientConfig failPolicy(String route, FailPolicy policy) {
        failPolicies.put(route, policy);
        return this;
    }

    /** The policy of routes not listed (open, like the Rust client). */
    public ClientConfig defaultFailPolicy(FailPolicy policy) {
        defaultFailPolicy = policy;
        return this;
    }

    /**
     * Lets a closed route through at {@code limit} per {@code period} (burst
     * {@code burst}) in this process while the daemon is unreachable: a
     * conservative floor instead of an outage. Size it for one process of many.
     */
    public ClientConfig staticBudget(String route, long limit, Duration period, long burst) {
        long periodUs = Math.max(1, period.toNanos() / 1000);
        staticBudgets.put(route, Gcra.Spec.of(limit, periodUs, burst));
        return this;
    }

    public Path socket() {
        return socket;
    }

    public Duration timeout() {
        return timeout;
    }

    public Duration busyMax() {
        return busyMax;
    }

    public int protocolVersion() {
        return protocolVersion;
    }

    public FailPolicy failPolicy(String route) {
        return failPolicies.getOrDefault(route, defaultFailPolicy);
    }

    ClientConfig copy() {
        ClientConfig c = new ClientConfig(socket);
        c.timeout = timeout;
        c.busyMax = busyMax;
        c.protocolVersion = protocolVersion;
        c.failPolicies.clear();
        c.failPolicies.putAll(failPolicies);
        c.defaultFailPolicy = defaultFailPolicy;
        c.staticBudgets.putAll(staticBudgets);
        return c;
    }
}
