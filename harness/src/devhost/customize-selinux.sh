#!/bin/sh
# flex-harness dev host, SELinux variant: the second customize hook, run after customize.sh.
#   $1  the new root
# Installs the harness's local policy modules (CIL, if any), then labels the whole tree with
# the image's own file_contexts. setfiles runs in the new root, whose policy it reads; the build
# machine needs no SELinux: setfiles only writes security.selinux extended attributes, which
# mkfs.ext4 -d copies into the image. -e leaves out the /proc, /sys and /dev that mmdebstrap
# mounts in it (the kernel labels those at boot).
set -eu
R=$1
grep -q '^CONFIG_SECURITY_SELINUX=y' "$R"/boot/config-*
for m in "$R"/usr/local/share/flex-devhost/selinux/*.cil; do
  [ -e "$m" ] || continue
  chroot "$R" semodule -i "/usr/local/share/flex-devhost/selinux/$(basename "$m")"
done
chroot "$R" setfiles -F -e /proc -e /sys -e /dev /etc/selinux/default/contexts/files/file_contexts /
# For the build log (the build checks the labels in the finished image with debugfs).
chroot "$R" ls -dZ /usr/lib/systemd/systemd /etc/ssh /var/lib || true
