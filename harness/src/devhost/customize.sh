#!/bin/sh
# flex-harness dev host: mmdebstrap's customize hook (guest-host.md §3.1), run as root on the
# build machine while the new root's /proc, /sys and /dev are mounted.
#   $1  the new root
#   $2  a directory holding the dev host's files at their paths in the root (modes set)
set -eu
R=$1
# --remove-destination: never write through a symlink in the new root.
cp -a --remove-destination "$2"/. "$R"/
mkdir -p "$R/var/lib/usr-local/upper" "$R/var/lib/usr-local/work"
chroot "$R" systemctl enable systemd-networkd.service usr-readonly.service boot-marker.service
chroot "$R" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_reap.service e2scrub_all.timer
# No empty root password and no console autologin: the harness logs in over SSH with a key that
# Ignition installs.
chroot "$R" visudo -c -f /etc/sudoers.d/50-flex-devhost
mkdir -p "$R/run/sshd"
chroot "$R" /usr/sbin/sshd -t
rm -rf "$R/run/sshd"
