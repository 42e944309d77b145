package dev.tollgate.client;

import java.nio.file.Path;

/** Runs every test group; exits non-zero when any check fails. Argument: the repository's root. */
public final class AllTests {
    private AllTests() {
    }

    public static void main(String[] args) throws Exception {
        Path root = Path.of(args.length > 0 ? args[0] : "../..");
        try {
            VectorTests.run(root);
            LogicTests.run();
            PreflightTests.run();
            FakeDaemonTests.run();
            AcceptQueueTests.run();
            FdLimitTests.run();
            LiveDaemonTests.run();
        } catch (Throwable t) {
            Expect.failures++;
            System.out.println("FAIL [" + Expect.group + "] threw:");
            t.printStackTrace(System.out);
        }
        System.out.println(Expect.checks + " checks, " + Expect.failures + " failed");
        System.exit(Expect.failures == 0 ? 0 : 1);
    }
}
