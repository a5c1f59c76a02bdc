#!/bin/sh
# apache2-site.sh - a private copy of Debian's apache2 configuration, as
# the package installs it, with only the port and the paths changed: for
# the daemons suite (tests/py/test_daemons.py) and make bench (bench/run.py).
#
#   tools/apache2-site.sh CONFDIR PORT [MPM]
#       CONFDIR gets /etc/apache2's files, listening on 127.0.0.1:PORT, its
#       run, lock and log directories and its document root (www/) inside;
#       MPM (event, prefork, worker) replaces the enabled one.  Start it as
#       the package does: . CONFDIR/envvars && apache2 -d CONFDIR.
set -eu
conf=$1; port=$2; mpm=${3:-}
cp -a /etc/apache2/. "$conf/"
sed -i "s/^Listen 80$/Listen 127.0.0.1:$port/" "$conf/ports.conf"
sed -i "s/<VirtualHost \*:80>/<VirtualHost *:$port>/; s#/var/www/html#$conf/www#" \
    "$conf/sites-enabled/000-default.conf"
sed -i "s#/var/run/apache2#$conf/run#; s#/var/lock/apache2#$conf/lock#; s#/var/log/apache2#$conf/log#" \
    "$conf/envvars"
sed -i "s#<Directory /var/www/>#<Directory $conf/www/>#" "$conf/apache2.conf"
if [ -n "$mpm" ]; then
	rm -f "$conf"/mods-enabled/mpm_*
	ln -s "$conf/mods-available/mpm_$mpm.load" "$conf/mods-available/mpm_$mpm.conf" \
		"$conf/mods-enabled/"
fi
mkdir -p "$conf/run" "$conf/lock" "$conf/log" "$conf/www"
