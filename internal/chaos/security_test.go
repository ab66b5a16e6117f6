//go:build reliability

package chaos

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/pgtemp"
	"github.com/ingest-worker/ingest/task"
)

// writeCerts writes a CA and a server certificate for 127.0.0.1 signed by
// it into dir: ca.pem, server.pem, server.key.
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ingest chaos test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("ca.pem", "CERTIFICATE", caDER)
	write("server.pem", "CERTIFICATE", srvDER)
	write("server.key", "EC PRIVATE KEY", keyDER)
}

// TestRedisTLS: the workers talk to Redis over TLS only (rediss://, a
// certificate of a test CA trusted through SSL_CERT_FILE) and run a
// workload with a worker kill to completion.
func TestRedisTLS(t *testing.T) {
	dir := t.TempDir()
	writeCerts(t, dir)
	port, err := pgtemp.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, clusterOptions{redisArgs: []string{
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", filepath.Join(dir, "server.pem"), "--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"), "--tls-auth-clients", "no",
	}})
	start := time.Now()
	tlsURL := fmt.Sprintf("rediss://:%s@127.0.0.1:%d/0", c.secret, port)

	// The TLS port is real TLS: without trusting the CA the handshake fails.
	opt, err := redis.ParseURL(tlsURL)
	if err != nil {
		t.Fatal(err)
	}
	untrusting := redis.NewClient(opt)
	err = untrusting.Ping(context.Background()).Err()
	untrusting.Close()
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("PING over TLS without trusting the test CA: got %v, want a certificate error", err)
	}

	ws := c.spawn("w", 2, "CHAOS_REDIS_URL="+tlsURL, "SSL_CERT_FILE="+filepath.Join(dir, "ca.pem"))
	n := size(500, 5000)
	c.enqueue("ok", n, 5, 50)
	c.eventually(time.Minute, "some tasks done", func() bool { return c.count(task.Succeeded) >= n/4 })
	ws[0].kill()
	c.finish(row{Scenario: "security: Redis over TLS (rediss://), one worker killed"}, expect{}, start)
}

// requiredCommands are the Redis commands the system needs: the ACL of a
// least-privilege user (TestRedisACL checks that a run uses no others and
// that the service works with only these).
var requiredCommands = []string{
	// connection set-up by go-redis
	"hello", "auth", "client|setinfo", "client|setname", "ping", "select",
	// the consumer group, the reclaimer, the heartbeat and the DLQ script
	"xreadgroup", "xack", "xclaim", "xautoclaim", "xpending", "xgroup|create", "xgroup|createconsumer",
	"xgroup|delconsumer", "xinfo|groups", "xinfo|consumers", "xinfo|stream", "xlen", "xrange", "xrevrange",
	"xdel", "xtrim", "xadd", "evalsha", "eval", "script|load", "script|exists",
	// the DLQ script's marker of a death already dead-lettered
	"exists", "set",
	// start-up checks and metrics
	"info", "config|get",
}

// TestRedisACL runs the service as a Redis ACL user that has only the
// commands of requiredCommands on the ingest:* keys. Probe first runs the
// same workload as a user with every command and lists the commands it
// really used; they must all be in requiredCommands.
func TestRedisACL(t *testing.T) {
	workload := func(c *cluster, user, pass string) {
		ws := c.spawn("w", 2, fmt.Sprintf("CHAOS_REDIS_URL=redis://%s:%s@%s/0", user, pass, c.redis.Addr()))
		n := size(400, 4000)
		c.enqueue("ok", n, 5, 50)
		c.enqueue("panic", 4, 0, 2)
		c.injectPoison(3)
		c.eventually(time.Minute, "some tasks done", func() bool { return c.count(task.Succeeded) >= n/4 })
		ws[0].kill() // the reclaimer's and the rescuer's paths
		c.eventually(time.Minute, "all tasks finished", func() bool { return c.notTerminal() == 0 })
	}
	// aclUser creates user with the rules; a command this server does not
	// know (client|setinfo is Redis 7.2+) is left out.
	aclUser := func(c *cluster, user, pass string, rules ...string) {
		ctx := context.Background()
		c.extraSecrets = append(c.extraSecrets, pass)
		if err := c.admin.Do(ctx, "ACL", "SETUSER", user, "reset", "on", ">"+pass).Err(); err != nil {
			c.t.Fatalf("ACL SETUSER %s: %v", user, err)
		}
		for _, r := range rules {
			err := c.admin.Do(ctx, "ACL", "SETUSER", user, r).Err()
			if err != nil && strings.Contains(err.Error(), "Unknown command") {
				c.t.Logf("ACL SETUSER %s %s: %v (not on this Redis version)", user, r, err)
				continue
			}
			if err != nil {
				c.t.Fatalf("ACL SETUSER %s %s: %v", user, r, err)
			}
		}
	}

	t.Run("Probe", func(t *testing.T) {
		c := newCluster(t, clusterOptions{})
		start := time.Now()
		aclUser(c, "probe", "pp-"+randomHex(8), "~*", "&*", "+@all")
		if err := c.admin.ConfigResetStat(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		workload(c, "probe", c.extraSecrets[0])
		info, err := c.admin.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var used, extra []string
		for _, cmd := range commandsIn(info) {
			if cmd == "config|resetstat" {
				continue // the test's own
			}
			used = append(used, cmd)
			if !slices.Contains(requiredCommands, cmd) {
				extra = append(extra, cmd)
			}
		}
		if len(extra) > 0 {
			t.Errorf("the service used commands missing from requiredCommands: %v", extra)
		}
		c.finish(row{Scenario: "security: Redis ACL probe (+@all user)", Notes: "commands used: " + strings.Join(used, " ")},
			expect{deadKinds: []string{"panic"}, poison: 3}, start)
	})

	t.Run("LeastPrivilege", func(t *testing.T) {
		c := newCluster(t, clusterOptions{})
		start := time.Now()
		rules := []string{"resetkeys", "~ingest:*", "resetchannels", "-@all"}
		for _, cmd := range requiredCommands {
			rules = append(rules, "+"+cmd)
		}
		aclUser(c, "ingest", "ip-"+randomHex(8), rules...)
		if err := c.admin.Do(context.Background(), "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
		workload(c, "ingest", c.extraSecrets[0])
		denied, err := c.admin.Do(context.Background(), "ACL", "LOG").Slice()
		if err != nil {
			t.Fatal(err)
		}
		if len(denied) > 0 {
			t.Errorf("ACL LOG holds %d denials of the least-privilege user: %v", len(denied), denied)
		}
		c.finish(row{Scenario: "security: Redis ACL least-privilege user", Notes: fmt.Sprintf("%d commands allowed, %d denials", len(requiredCommands), len(denied))},
			expect{deadKinds: []string{"panic"}, poison: 3}, start)
	})
}

// commandsIn returns the command names of INFO commandstats
// ("cmdstat_xgroup|create:calls=1,..." → "xgroup|create"), sorted.
func commandsIn(info string) []string {
	var cmds []string
	for _, l := range strings.Split(info, "\n") {
		name, _, ok := strings.Cut(strings.TrimSpace(l), ":")
		if cmd, found := strings.CutPrefix(name, "cmdstat_"); ok && found {
			cmds = append(cmds, cmd)
		}
	}
	sort.Strings(cmds)
	return cmds
}

// TestWrongRedisPassword: a worker given a wrong Redis password stops at
// start-up with a message that says what failed and does not echo the
// password; so does the ingest-worker binary.
func TestWrongRedisPassword(t *testing.T) {
	c := newCluster(t, clusterOptions{})
	wrong := "wrong-" + randomHex(8)
	check := func(t *testing.T, what string, out []byte, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s started with a wrong Redis password; output:\n%s", what, out)
		}
		s := string(out)
		if !strings.Contains(s, "WRONGPASS") && !strings.Contains(s, "NOAUTH") {
			t.Errorf("%s: the message does not say the authentication failed:\n%s", what, s)
		}
		if strings.Contains(s, wrong) || strings.Contains(s, c.secret) {
			t.Errorf("%s echoed a password:\n%s", what, strings.NewReplacer(wrong, "<WRONG>", c.secret, "<SECRET>").Replace(s))
		}
		t.Logf("%s: %s", what, strings.TrimSpace(strings.NewReplacer(wrong, "<WRONG>", c.secret, "<SECRET>").Replace(s)))
	}
	for _, url := range []string{
		fmt.Sprintf("redis://:%s@%s/0", wrong, c.redis.Addr()),
		fmt.Sprintf("redis://default:%s@%s/0", wrong, c.redis.Addr()),
	} {
		cmd := exec.Command(workerBin)
		cmd.Env = append(append(os.Environ(), c.env...), "CHAOS_REDIS_URL="+url)
		out, err := runWithTimeout(cmd, 30*time.Second)
		check(t, "chaosworker", out, err)
	}

	t.Run("Binary", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "ingest-worker")
		if err := goBuild(bin, "github.com/ingest-worker/ingest/cmd/ingest-worker", false); err != nil {
			t.Fatalf("the ingest-worker binary does not build: %v", err)
		}
		cmd := exec.Command(bin, "run", "--webhook-url", "http://127.0.0.1:9/hook", "--http-addr", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), "INGEST_DATABASE_URL="+c.db.URL,
			"INGEST_REDIS_URL="+fmt.Sprintf("redis://:%s@%s/0", wrong, c.redis.Addr()))
		out, err := runWithTimeout(cmd, 30*time.Second)
		check(t, "ingest-worker run", out, err)
	})
}

// runWithTimeout runs cmd and returns its combined output; it kills cmd
// after d.
func runWithTimeout(cmd *exec.Cmd, d time.Duration) ([]byte, error) {
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return buf.Bytes(), err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return buf.Bytes(), fmt.Errorf("still running after %s", d)
	}
}
