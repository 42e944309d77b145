package dev.tollgate.client;

import java.io.FileInputStream;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * An auth server out of file descriptors (EMFILE: an attacker can cause it)
 * cannot create the socket: that is a late daemon, a timeout under the busy
 * rule, never "cannot be reached" (which would let login fail open on a
 * locked account). Run in a child JVM whose descriptor limit is lowered.
 */
final class FdLimitTests {
    private FdLimitTests() {
    }

    static void run() throws Exception {
        Expect.group("out of file descriptors (EMFILE) is a late daemon, not a down one");
        String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
        ProcessBuilder pb = new ProcessBuilder("bash", "-c",
                "ulimit -n 256 && exec \"$0\" -cp \"$1\" dev.tollgate.client.FdLimitTests",
                java, System.getProperty("java.class.path")).redirectErrorStream(true);
        Process child = pb.start();
        String out = new String(child.getInputStream().readAllBytes());
        boolean ended = child.waitFor(60, TimeUnit.SECONDS);
        Expect.that(ended && child.exitValue() == 0, "the child ran: " + out);
        Expect.that(out.contains("exhausted true"), "the child ran out of descriptors: " + out);
        Expect.that(out.contains("lone TIMEOUT proceeds"), "a lone check, EMFILE: timeout (the policy applies), not connect: " + out);
        Expect.that(out.contains("pair BUSY BUSY refused"), "an overlapped pair on one account, EMFILE: busy, never proceeds: " + out);
    }

    /** The child: warms a client, uses up its descriptors, then checks. */
    public static void main(String[] args) throws Exception {
        Path dir = Files.createTempDirectory("tollgate-emfile");
        Path socket = dir.resolve("t.sock");
        // Loaded now: with no descriptor left, no class file can be opened.
        try (DirectoryStream<Path> classes = Files.newDirectoryStream(
                Path.of(FdLimitTests.class.getProtectionDomain().getCodeSource().getLocation().toURI()).resolve("dev/tollgate/client"), "*.class")) {
            for (Path c : classes) {
                String name = c.getFileName().toString();
                Class.forName("dev.tollgate.client." + name.substring(0, name.length() - 6), false, FdLimitTests.class.getClassLoader());
            }
        }
        List<FileInputStream> fillers = new ArrayList<>();
        StringBuilder report = new StringBuilder();
        try (ServerSocketChannel server = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
            server.bind(UnixDomainSocketAddress.of(socket));
            Thread once = new Thread(() -> AcceptQueueTests.answerOnce(server), "accept-once");
            once.setDaemon(true);
            once.start();
            Subject alice = FakeDaemonTests.subject("alice");
            try (Client never = new Client(ClientConfig.of(socket).timeout(Duration.ofSeconds(2)));
                    Client client = new Client(ClientConfig.of(socket).timeout(Duration.ofSeconds(2)))) {
                boolean warm = client.check("login", FakeDaemonTests.subject("warm")).verdict().isPresent();
                once.join();
                client.close(); // no pooled connection: every call creates a socket
                Answer[] pair = new Answer[2];
                Thread[] threads = {new Thread(() -> pair[0] = client.check("login", alice)),
                    new Thread(() -> pair[1] = client.check("login", alice))};
                Object pool = AcceptQueueTests.poolOf(client);
                Answer lone;
                boolean exhausted = false;
                try {
                    while (fillers.size() < 1024) fillers.add(new FileInputStream("/dev/null"));
                } catch (IOException e) {
                    exhausted = true;
                }
                try {
                    lone = never.check("login", alice);
                    // Both wait on the pool's lock (taken before connecting): overlapped.
                    synchronized (pool) {
                        for (Thread t : threads) t.start();
                        Thread.sleep(30);
                    }
                    for (Thread t : threads) t.join();
                } finally {
                    for (FileInputStream f : fillers) f.close();
                }
                report.append("warm ").append(warm).append('\n');
                report.append("exhausted ").append(exhausted).append('\n');
                report.append("lone ").append(FakeDaemonTests.kind(lone)).append(lone.proceeds() ? " proceeds" : " refused")
                        .append(" ").append(lone).append('\n');
                report.append("pair ").append(FakeDaemonTests.kind(pair[0])).append(' ').append(FakeDaemonTests.kind(pair[1]))
                        .append(pair[0].proceeds() || pair[1].proceeds() ? " proceeds" : " refused").append('\n');
            }
        } finally {
            Files.deleteIfExists(socket);
            Files.deleteIfExists(dir);
        }
        System.out.print(report);
    }
}
