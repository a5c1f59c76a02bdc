# manversion.cmake - copies a manual page, naming the version in its .TH line
# (the fourth field, "smclo" in the source, becomes "smclo VERSION"): the
# version is written only in CMakeLists.txt's project().
# Usage: cmake -DIN=man/smclo.1 -DOUT=build/man/smclo.1 -DVERSION=x.y.z -P manversion.cmake
file(READ "${IN}" text)
string(REGEX REPLACE "(\n?\\.TH [^ ]+ [^ ]+ [^ ]+ )\"smclo[^\"]*\"" "\\1\"smclo ${VERSION}\""
       text "${text}")
file(WRITE "${OUT}" "${text}")
