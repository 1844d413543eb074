package streaming

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
)

// watchHijack returns w and r wrapped so that the returned request's context ends when
// the hijacked connection does. net/http stops watching a connection once SPDY or
// websocket hijacks it, so without this a session whose client vanished would only
// notice on its next write: an attach to a quiet container, or an exec that prints
// nothing, would live on with its FIFOs and goroutines.
//
// Both protocol stacks read the connection continuously (frames, pings), so a failed
// read is the peer going away.
func watchHijack(w http.ResponseWriter, r *http.Request) (http.ResponseWriter, *http.Request, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	return &hijackWatcher{ResponseWriter: w, cancel: cancel}, r.WithContext(ctx), cancel
}

// hijackWatcher deliberately has no Unwrap: the libraries' websocket code unwraps
// response writers and would hijack the original one, bypassing the watch.
type hijackWatcher struct {
	http.ResponseWriter
	cancel context.CancelFunc
}

func (w *hijackWatcher) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("the response writer cannot be hijacked")
	}
	c, rw, err := h.Hijack()
	if err != nil {
		return nil, nil, err
	}
	wc := &watchedConn{Conn: c, cancel: w.cancel}
	// The buffered reader may already hold bytes the client sent after its request;
	// they are served first, then the watched connection.
	buffered, _ := rw.Reader.Peek(rw.Reader.Buffered())
	rd := io.MultiReader(bytes.NewReader(bytes.Clone(buffered)), wc)
	return wc, bufio.NewReadWriter(bufio.NewReader(rd), bufio.NewWriter(wc)), nil
}

// Flush lets the protocol handlers flush an error response before any hijack.
func (w *hijackWatcher) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// watchedConn cancels the session's context when a read fails or it is closed.
type watchedConn struct {
	net.Conn
	cancel context.CancelFunc
	once   sync.Once
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.once.Do(c.cancel)
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.once.Do(c.cancel)
	return c.Conn.Close()
}
