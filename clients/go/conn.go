package tollgate

// Opening a connection, and telling a late daemon from a gone one: a
// daemon that is late is never taken for one that cannot be reached, or
// login would fail open for an attacker who made it late.

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
