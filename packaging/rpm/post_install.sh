install -d -m 0755 /var/lib/allot /var/lib/allot/agent
install -d -m 0750 -o allot -g allot /var/lib/allot/allotd
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
    if [ "$1" -eq 1 ]; then
        # First install: the agent on every host; allotd is enabled by hand.
        systemctl enable --now allot-agent.service >/dev/null 2>&1 || true
    else
        # Upgrade: KillMode=process keeps workloads running across the restart.
        systemctl try-restart allot-agent.service allotd.service >/dev/null 2>&1 || true
    fi
fi
exit 0
