package tollgate

// Opening a connection, and telling a late daemon from a gone one: a
// daemon that is late is never taken for one that cannot be reached, nor
// one that answers just after the deadline for one that does not answer,
// or login would fail open for an attacker who made it late.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// cancelWatch makes a cancelled context abort the connection in use.
type cancelWatch struct {
	mu       sync.Mutex
	current  *conn
	canceled bool
}

func (w *cancelWatch) use(cn *conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.current = cn
	if w.canceled {
		cn.c.SetDeadline(time.Unix(1, 0))
	}
}

// detach lets the connection go (to the pool): a cancel coming later, from
// a watcher that lost the race with the reply, must not set a past
// deadline on a connection another call may already be using.
func (w *cancelWatch) detach() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.current = nil
}

func (w *cancelWatch) cancel() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.canceled = true
	if w.current != nil {
		w.current.c.SetDeadline(time.Unix(1, 0))
	}
}

func (w *cancelWatch) wasCanceled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.canceled
}

func (c *Client) connect(deadline time.Time, watch *cancelWatch) (*conn, *CallError) {
	if c.beforeConnect != nil {
		c.beforeConnect()
	}
	dialer := net.Dialer{Deadline: deadline}
	nc, err := dialer.Dial("unix", c.cfg.Socket)
	if err != nil {
		return nil, connectError(c.cfg.Socket, err)
	}
	if watch.wasCanceled() {
		nc.Close()
		return nil, &CallError{Kind: ErrCanceled, Err: context.Canceled}
	}
	return &conn{c: nc.(*net.UnixConn), buf: make([]byte, 0, 256), version: c.cfg.ProtocolVersion}, nil
}

// connectError: only no socket (ENOENT), nobody listening (ECONNREFUSED)
// and not allowed (EACCES) are ErrConnect. Any other failure to create or
// connect the socket (a full accept queue's EAGAIN, a dial out of time,
// EMFILE, ENFILE, ENOBUFS, ENOMEM) is the daemon being late, a timeout for
// the busy rule: an attacker who exhausts this process's descriptors or
// memory must not turn a burst on a locked account into an outage that
// fails open.
func connectError(socket string, err error) *CallError {
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EACCES) {
		return &CallError{Kind: ErrConnect, Err: fmt.Errorf("cannot reach tollgate at %s: %w", socket, err)}
	}
	return &CallError{Kind: ErrTimeout, Err: err}
}

func ioError(err error) *CallError {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return &CallError{Kind: ErrTimeout, Err: err}
	}
	return &CallError{Kind: ErrIO, Err: err}
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// deadlineKind classifies a check its caller's deadline cut short: the
// caller's doing (ErrDeadline, never proceeds) unless the client's own
// timeouts already show an outage, a run of them that busyAt does not take
// for a busy daemon. Then it is ErrTimeout and the policy applies, so a
// lone user whose requests carry short deadlines is not refused for a
// whole outage. A daemon with no run of timeouts is taken for healthy,
// even one not heard from yet (a fresh process must not let tiny
// deadlines through).
func (c *Client) deadlineKind() ErrorKind {
	c.lateMu.Lock()
	now, run := c.nowUs(), c.lateRun
	// A late reply heard after the run's last timeout: the next timeout
	// would begin a new run (joinRun), so the old one shows no outage.
	heardAfter := c.lastHeard.Load() > run[1]
	c.lateMu.Unlock()
	if run[1] != 0 && !heardAfter && !c.busyAt(now, run) {
		return ErrTimeout
	}
	return ErrDeadline
}

// joinRun adds a timeout at now to the run of timeouts (c.lateMu held),
// and starts the run at now when there is none. It also starts it anew
// when a late reply was heard after the run's last timeout. That reply
// shows the daemon was alive and answering after the run, so this
// timeout belongs to a new run. Without this, load from elsewhere can keep
// the daemon late while this client makes no calls for longer than
// BusyMax. Then the run, the last answer in time and the last late reply
// are all older than BusyMax, and a burst that times out before any of its
// own late replies come would be taken for an outage and proceed. A frozen
// or dead daemon is never heard late, so its sparse timeouts stay one run
// that grows old and becomes an outage.
func (c *Client) joinRun(now uint64) {
	if c.lateRun[1] == 0 || c.lastHeard.Load() > c.lateRun[1] {
		c.lateRun[0] = now
	}
	if now > c.lateRun[1] {
		c.lateRun[1] = now
	}
}

// busyAt: whether a timeout at now in the run of timeouts run is the
// daemon busy, not down. It has answered this client in time at least
// once (a daemon never answered in time is not busy), and the run is
// younger than BusyMax, or it answered a call in time within BusyMax
// (bursts closer together than BusyMax would otherwise age one run past
// it and fail open), or a reply to a timed-out call was heard within
// BusyMax (load, or an attacker's bursts, can keep it late for every call
// while it is alive and answering just after the deadline). BusyMax 0:
// never busy.
func (c *Client) busyAt(now uint64, run [2]uint64) bool {
	busyMaxUs := uint64(c.cfg.BusyMax / time.Microsecond)
	answered, heard := c.lastAnswered.Load(), c.lastHeard.Load()
	if answered == 0 {
		return false
	}
	return since(now, run[0]) < busyMaxUs || since(now, answered) < busyMaxUs ||
		(heard != 0 && since(now, heard) < busyMaxUs)
}

// since is now - then in µs, 0 for a then read after now.
func since(now, then uint64) uint64 {
	if then > now {
		return 0
	}
	return now - then
}

// listenLate takes a connection whose call timed out after its request
// was written whole. The reply is still on its way, and hearing it tells a
// daemon kept late for every call (by load, or by an attacker's bursts)
// from a gone one: closed at once, the connection would never tell, and
// such a daemon would read as an outage that fails open after BusyMax. A
// goroutine listens for at most BusyMax, so the caller returns when it
// would have anyway; any byte that comes is the daemon answering, and
// records lastHeard (no parsing: only the daemon writes on its socket).
// Then the connection is closed, never reused: its state is unknown.
// With LateListenersMax already listening, with BusyMax 0 (every timeout
// is an outage, so nothing heard would count) or once the client is
// closed, the connection is closed at once.
func (c *Client) listenLate(cn *conn) {
	c.poolMu.Lock()
	listen := c.cfg.BusyMax > 0 && !c.closed && len(c.listening) < LateListenersMax
	if listen {
		c.listening[cn] = struct{}{}
	}
	c.poolMu.Unlock()
	if !listen {
		cn.c.Close()
		return
	}
	go func() {
		defer func() {
			c.poolMu.Lock()
			delete(c.listening, cn)
			c.poolMu.Unlock()
			cn.c.Close()
		}()
		if cn.c.SetReadDeadline(time.Now().Add(c.cfg.BusyMax)) != nil {
			return
		}
		var b [1]byte
		if n, _ := cn.c.Read(b[:]); n == 0 {
			return
		}
		// Listeners hearing at once may store out of order: keep the latest.
		for heard := c.nowUs(); ; {
			last := c.lastHeard.Load()
			if last >= heard || c.lastHeard.CompareAndSwap(last, heard) {
				return
			}
		}
	}()
}
