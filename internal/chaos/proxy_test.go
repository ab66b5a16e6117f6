//go:build reliability

package chaos

import (
	"io"
	"net"
	"testing"
	"time"
)

// slowProxy forwards TCP connections to target, delaying each chunk sent
// to it by delay: it stretches the time a relay holds its claims so that a
// SIGSTOP catches it mid-pass. It returns the proxy's address.
func slowProxy(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			go func() {
				defer out.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := in.Read(buf)
					if n > 0 {
						time.Sleep(delay) // the injected latency
						if _, werr := out.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer in.Close()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
	return l.Addr().String()
}
