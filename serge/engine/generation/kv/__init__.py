"""Key/value memory kept beyond one reply: the prefix cache, its copy on disk, shared prefixes and warming."""
