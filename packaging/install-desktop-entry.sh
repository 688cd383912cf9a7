#!/bin/sh
# Adds OmniDraft to this user's application menu: the .desktop entry, pointing at
# the executable beside this script, and its icon. Run from the unpacked bundle:
#   ./install-desktop-entry.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}
install -Dm644 "$here/omnidraft.svg" "$data/icons/hicolor/scalable/apps/omnidraft.svg"
mkdir -p "$data/applications"
sed "s|^Exec=omnidraft|Exec=\"$here/omnidraft\"|" "$here/omnidraft.desktop" > "$data/applications/omnidraft.desktop"
chmod 644 "$data/applications/omnidraft.desktop"
echo "Installed $data/applications/omnidraft.desktop (Exec=$here/omnidraft)"
