"""Adapters that put ctxbroker behind the memory interfaces of agent
frameworks. Each lives in its own module and needs its framework, installed
by the extra of the same name; importing this package imports none of them.
"""
