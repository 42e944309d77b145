// A fake daemon that allows everything, on its own thread: it answers while
// the test holds the main thread's event loop, and on "hold" stops its own
// thread (no accepts, no reads) until the test releases it.

import { parentPort, workerData } from "node:worker_threads";
import { allowAll, fakeDaemon } from "./fake_daemon.mjs";

const { backlog, held } = workerData ?? {};
const daemon = await fakeDaemon(allowAll, { backlog });
parentPort.on("message", (message) => {
  if (message !== "hold") return;
  Atomics.store(held, 1, 1);
  Atomics.wait(held, 0, 1);
  Atomics.store(held, 1, 0);
});
parentPort.postMessage(daemon.path);
