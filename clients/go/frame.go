package tollgate

// Reading a reply frame. A reply that has arrived by the deadline wins
// over the deadline: Go's poller refuses a read once the deadline has
// passed, without looking at the socket, so a goroutine descheduled past
// its deadline (a busy process, a GC pause) would take a verdict already
// in the socket's buffer for a timeout, and an open route would proceed
// on a locked account. After a deadline error the client looks once more,
// without waiting, as tokio polls a call before its timer.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// replyBufferBytes: a verdict or error reply fits, read in one go.
const replyBufferBytes = 512

// readReply reads one reply frame and returns its payload (valid until
// the connection's next read).
func (cn *conn) readReply() ([]byte, *CallError) {
	if cap(cn.read) < replyBufferBytes {
		cn.read = make([]byte, replyBufferBytes)
	}
	have := 0
	for {
		payload, done, perr := cn.frameIn(have)
		if done || perr != nil {
			return payload, perr
		}
		n, err := cn.c.Read(cn.read[have:cap(cn.read)])
		have += n
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if payload, done, perr := cn.readArrived(have); done || perr != nil {
				return payload, perr
			}
		}
		return nil, ioError(err)
	}
}

// readArrived is the last look after the deadline: whatever the socket
// already holds, read without waiting, completes the frame or not.
func (cn *conn) readArrived(have int) ([]byte, bool, *CallError) {
	// A read under a past deadline fails before it reaches the socket.
	if cn.c.SetReadDeadline(time.Time{}) != nil {
		return nil, false, nil
	}
	raw, err := cn.c.SyscallConn()
	if err != nil {
		return nil, false, nil
	}
	for {
		n := 0
		// The func returns true: one attempt, never a wait for more.
		raw.Read(func(fd uintptr) bool {
			if k, err := syscall.Read(int(fd), cn.read[have:cap(cn.read)]); err == nil && k > 0 {
				n = k
			}
			return true
		})
		if n == 0 {
			return nil, false, nil
		}
		have += n
		if payload, done, perr := cn.frameIn(have); done || perr != nil {
			return payload, done, perr
		}
	}
}

// frameIn tells whether the first have bytes read are a whole frame (its
// payload) or a bad one; for a frame longer than the buffer, it grows the
// buffer to fit. The daemon sends one reply per request: bytes past the
// frame are a broken connection.
func (cn *conn) frameIn(have int) ([]byte, bool, *CallError) {
	if have < frameHeaderBytes {
		return nil, false, nil
	}
	n := binary.LittleEndian.Uint32(cn.read[:frameHeaderBytes])
	if n > ResponsePayloadBytesMax {
		return nil, false, &CallError{Kind: ErrProtocol, Err: fmt.Errorf("reply of %d bytes is over the maximum", n)}
	}
	total := frameHeaderBytes + int(n)
	switch {
	case have == total:
		return cn.read[frameHeaderBytes:total], true, nil
	case have > total:
		return nil, false, &CallError{Kind: ErrProtocol, Err: fmt.Errorf("%d byte(s) after the reply", have-total)}
	}
	if cap(cn.read) < total {
		grown := make([]byte, total)
		copy(grown, cn.read[:have])
		cn.read = grown
	}
	return nil, false, nil
}
