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
# refpolicy's container module, which Debian's policy package leaves out: built from Debian's
# own policy source (selinux-policy-src) against the image's policy headers
# (selinux-policy-dev), both then purged with what only they pulled in (python3, make, the
# policy compiler; apt would keep what an installed package merely suggests). It labels runc
# container_engine_exec_t and containerd's directories container_*, and moves runc, executing
# a container's files labelled so, to spc_t: ACL's domain for the agent's container when
# /var/lib/containerd is labelled (docs/SELINUX.md). The local modules below name its types.
B=/usr/local/src/flex-container-module
mkdir -p "$R$B"
chroot "$R" tar --zstd -xf /usr/src/selinux-policy-src.tar.zst -C "$B" --strip-components=4 \
  selinux-policy-src/policy/modules/services/container.te \
  selinux-policy-src/policy/modules/services/container.fc
chroot "$R" make -s -C "$B" -f /usr/share/selinux/devel/Makefile container.pp
chroot "$R" semodule -i "$B/container.pp"
rm -rf "$R$B"
chroot "$R" env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q \
  -o APT::AutoRemove::SuggestsImportant=false -o APT::AutoRemove::RecommendsImportant=false \
  --autoremove selinux-policy-src selinux-policy-dev
chroot "$R" semodule -l | grep -qx container
for m in "$R"/usr/local/share/flex-devhost/selinux/*.cil; do
  [ -e "$m" ] || continue
  chroot "$R" semodule -i "/usr/local/share/flex-devhost/selinux/$(basename "$m")"
done
# mmdebstrap's cleanup/reproducible, which the variant skips (--skip): it runs after this hook
# and would create /etc/machine-id anew, unlabelled (journald, networkd and tmpfiles are then
# refused reading it). The same files go, and machine-id is emptied in place, before labelling.
rm -f "$R"/var/log/dpkg.log "$R"/var/log/apt/history.log "$R"/var/log/apt/term.log \
  "$R"/var/log/alternatives.log "$R"/var/cache/ldconfig/aux-cache "$R"/var/log/apt/eipp.log.xz \
  "$R"/var/lib/dbus/machine-id
if [ -e "$R"/etc/machine-id ]; then : > "$R"/etc/machine-id; fi
# systemd-nspawn runs unconfined (initrc_t, as systemd starts bin_t services here), as it does
# on ACL (kernel_t): refpolicy's systemd_nspawn_t cannot run a whole OS from a var_lib_t tree
# (its first boot logged over 200 denials, the machine's systemd among them). A local file
# context, in the policy store and where libselinux reads it, so a later rebuild keeps it.
for f in "$R"/var/lib/selinux/default/active/file_contexts.local \
         "$R"/etc/selinux/default/contexts/files/file_contexts.local; do
  echo '/usr/bin/systemd-nspawn -- system_u:object_r:bin_t:s0' >> "$f"
done
chroot "$R" setfiles -F -e /proc -e /sys -e /dev /etc/selinux/default/contexts/files/file_contexts /
# For the build log (the build checks the labels in the finished image with debugfs).
chroot "$R" ls -dZ /usr/lib/systemd/systemd /etc/ssh /var/lib /etc/machine-id /usr/bin/systemd-nspawn || true
