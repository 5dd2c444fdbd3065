#!/usr/bin/env python3
"""Keystroke echo round trips of a session, as its user feels them: `allot run --pty
-- cat` on a terminal of this script's own, against a real `allotd serve` (TLS, a
token) and a real `allot-agent` on fake GPUs, all on loopback. Each sample types one
key and waits for the terminal to show it: CLI -> allotd -> agent -> the lease's
supervisor -> its PTY (whose echo sends it back) -> supervisor -> agent -> allotd ->
CLI. Prints p50/p90/p99/max in milliseconds.

    scripts/bench-attach.py [BIN_DIR] [--keys N]

BIN_DIR holds allotd, allot and allot-agent (default target/release).
"""
import fcntl, os, pty, select, shutil, signal, socket, statistics, subprocess, sys
import tempfile, termios, time


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def retry(what, f, tries=400):
    for _ in range(tries):
        r = f()
        if r:
            return r
        time.sleep(0.05)
    sys.exit(f"gave up waiting for {what}")


def read_until(fd, want, limit=30.0):
    """Reads the terminal until `want` (bytes) was shown; returns when it was."""
    seen, until = b"", time.perf_counter() + limit
    while want not in seen:
        left = until - time.perf_counter()
        if left <= 0:
            sys.exit(f"{want!r} not shown; the terminal: {seen[-400:]!r}")
        if select.select([fd], [], [], left)[0]:
            seen += os.read(fd, 4096)
    return time.perf_counter(), seen


def main():
    argv = sys.argv[1:]
    keys = 500
    if "--keys" in argv:
        i = argv.index("--keys")
        keys = int(argv[i + 1])
        del argv[i : i + 2]
    bins = os.path.abspath(argv[0] if argv else "target/release")
    allotd, allot, agent_bin = (os.path.join(bins, b) for b in ("allotd", "allot", "allot-agent"))
    d = tempfile.mkdtemp(prefix="allot-bench-attach-")
    listen = f"127.0.0.1:{port()}"
    me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    conf = os.path.join(d, "allotd.toml")
    with open(conf, "w") as f:
        f.write(f'[server]\nlisten = "{listen}"\nmetrics_listen = ""\nstate_dir = "{d}/state"\n'
                f'[roles]\nadmins = ["{me}"]\n[[group]]\nname = "demo-a"\nweight = 1\nopen = true\n')
    procs = [subprocess.Popen([allotd, "serve", "--config", conf],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    cli = None
    try:
        def allotd_says(*a):
            out = subprocess.run([allotd, *a, "--config", conf], capture_output=True, text=True)
            return out.stdout.strip() if out.returncode == 0 else None
        token = retry("allotd", lambda: allotd_says("tokens", "create", "--user", me))
        ca = os.path.join(d, "state", "pki", "ca.pem")
        agent_conf = os.path.join(d, "agent.toml")
        with open(agent_conf, "w") as f:
            f.write(f'[agent]\nsocket = "{d}/agent.sock"\nstate_dir = "{d}/agent"\n'
                    f'allocator = "https://{listen}"\nhost = "bench-node"\nallow_root = true\n'
                    '[health]\nsource = "fake:8"\n')
        enroll = retry("enrollment", lambda: allotd_says("nodes", "enroll", "bench-node"))
        subprocess.run([agent_bin, "--config", agent_conf, "enroll", "--server", f"https://{listen}",
                        "--token", enroll, "--ca", ca], check=True, stdout=subprocess.DEVNULL)
        procs.append(subprocess.Popen([agent_bin, "--config", agent_conf],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        env = dict(os.environ, ALLOT_SERVER=f"https://{listen}", ALLOT_CA=ca, ALLOT_TOKEN=token,
                   TERM="dumb")
        retry("the node", lambda: "bench-node" in subprocess.run(
            [allot, "nodes"], env=env, capture_output=True, text=True).stdout)

        def on_its_terminal():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        master, slave = pty.openpty()
        cli = subprocess.Popen([allot, "run", "--pty", "--project", "demo-a", "--gpus", "1",
                                "--", "cat"], env=env, stdin=slave, stdout=slave, stderr=slave,
                               preexec_fn=on_its_terminal)
        os.close(slave)
        read_until(master, b"~. detaches")
        # One key at a time, each waited for: the echo of the far terminal.
        times = []
        for i in range(keys):
            key = b"abcdefghijklmnopqrstuvwxyz"[i % 26 : i % 26 + 1]
            t0 = time.perf_counter()
            os.write(master, key)
            t1, _ = read_until(master, key)
            times.append((t1 - t0) * 1000)
            if i % 60 == 59:
                os.write(master, b"\r")
                read_until(master, b"\n")
        times.sort()
        p = lambda q: times[min(len(times) - 1, int(len(times) * q))]
        print(f"session keystroke echo, TLS on loopback ({bins}, {keys} keys)")
        print(f"  p50 {statistics.median(times):6.2f} ms   p90 {p(0.9):6.2f} ms"
              f"   p99 {p(0.99):6.2f} ms   max {times[-1]:6.2f} ms")
        # End of input at the start of a line: cat ends, and the command with it.
        os.write(master, b"\r\x04")
        cli.wait(30)
    finally:
        if cli and cli.poll() is None:
            cli.kill()
        for pr in reversed(procs):
            pr.send_signal(signal.SIGTERM)
            try:
                pr.wait(10)
            except subprocess.TimeoutExpired:
                pr.kill()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
