"""The controller: detect frozen hosts and stalled serving, recover, record."""
