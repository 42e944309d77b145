// A fake daemon that allows everything, on its own thread: it answers while
// the test holds the main thread's event loop.

import { parentPort } from "node:worker_threads";
import { allowAll, fakeDaemon } from "./fake_daemon.mjs";

const daemon = await fakeDaemon(allowAll);
parentPort.postMessage(daemon.path);
