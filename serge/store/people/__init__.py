"""The people side of the store: accounts, groups and their shares, sign-in links, and the audit log."""
