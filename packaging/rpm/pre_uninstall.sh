if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
    systemctl disable --now allotd.service allot-agent.service >/dev/null 2>&1 || true
fi
exit 0
