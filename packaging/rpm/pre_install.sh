# allot: the system group and user (kept on removal, like the state).
getent group allot >/dev/null || groupadd -r allot
getent passwd allot >/dev/null || useradd -r -g allot -d /var/lib/allot -s /sbin/nologin -c "allot allocator" allot
exit 0
