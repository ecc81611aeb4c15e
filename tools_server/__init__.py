"""The MCP read side: the five tools over stdio or streamable HTTP (the only package importing the MCP SDK)."""
