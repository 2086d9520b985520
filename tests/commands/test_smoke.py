from exporter.commands import build_parser


def test_serve_help_lists_flags_and_env() -> None:
    parser = build_parser({})
    args = parser.parse_args(["serve", "--no-collector.rdma"])
    assert args.collector_rdma is False
