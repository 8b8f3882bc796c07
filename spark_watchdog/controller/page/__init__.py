"""The status API and the operator's page: what they show and the actions they take
(docs/page.md)."""
