"""Authorization, pure: Kafka's ACL model (``acls``) and its standard authorizer's decisions
(``standard``); imports nothing else of the project."""
