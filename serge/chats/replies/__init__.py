"""Replies in progress: one reply generated and saved as it grows (reply.py), which chats answer now in this
process and in others (active.py, running.py), and chats warmed while they are read (warming.py)."""
