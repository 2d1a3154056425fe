"""Dockyard task executor: grades agent patches in fresh working trees and hosts shell sessions."""

__version__ = "0.1.0"
