"""IPU device-code rules: ipu_toolchain, ipu_kernel, ipu_kernel_library.

Every kernel is assembled once per source, architecture and declared
specialisation (its parameters), as one content-addressed Bazel action; the
compiler then picks specialisations from the library and falls back to the
generic kernel, whose shapes are run-time parameters.
"""

IPU_TOOLCHAIN_TYPE = "@//toolchains/ipu:toolchain_type"

IpuArchInfo = provider(doc = "The chosen device architecture.", fields = {"arch": "str"})

IpuKernelInfo = provider(
    doc = "One assembled kernel specialisation.",
    fields = {
        "name": "str: the specialisation's name (unique in a library)",
        "source": "File: the .S source",
        "object": "File: kernel.o",
        "metadata": "File: kernel.json",
        "params": "dict[str, str]: -D parameters of this specialisation",
        "arch": "str",
    },
)

IpuKernelLibraryInfo = provider(
    doc = "A set of kernels, as packages consume them.",
    fields = {
        "kernels": "depset[IpuKernelInfo]",
        "index": "File: library.json listing every kernel with its files",
        "files": "depset[File]: every object and metadata file",
    },
)

def _ipu_arch_flag_impl(ctx):
    return [IpuArchInfo(arch = ctx.build_setting_value)]

ipu_arch_flag = rule(
    implementation = _ipu_arch_flag_impl,
    build_setting = config.string(flag = True),
)

def _ipu_toolchain_impl(ctx):
    return [platform_common.ToolchainInfo(
        ipu = struct(
            assembler = ctx.attr.assembler[DefaultInfo].files_to_run,
            linker = ctx.attr.linker[DefaultInfo].files_to_run,
            supported_archs = ctx.attr.supported_archs,
        ),
    )]

ipu_toolchain = rule(
    implementation = _ipu_toolchain_impl,
    attrs = {
        "assembler": attr.label(executable = True, cfg = "exec", mandatory = True),
        "linker": attr.label(executable = True, cfg = "exec", mandatory = True),
        "supported_archs": attr.string_list(mandatory = True),
    },
)

def _ipu_kernel_impl(ctx):
    tools = ctx.toolchains[IPU_TOOLCHAIN_TYPE].ipu
    arch = ctx.attr.arch or ctx.attr._arch_flag[IpuArchInfo].arch
    if arch not in tools.supported_archs:
        fail("%s: architecture %r is not supported by the IPU toolchain (supported: %s)" %
             (ctx.label, arch, ", ".join(tools.supported_archs)))
    name = ctx.attr.kernel_name or ctx.label.name
    obj = ctx.actions.declare_file(ctx.label.name + "/kernel.o")
    meta = ctx.actions.declare_file(ctx.label.name + "/kernel.json")
    args = ctx.actions.args()
    args.add(ctx.file.src)
    args.add("-o", obj)
    args.add("--metadata", meta)
    args.add("--name", name)
    args.add("--target", arch)
    for key in sorted(ctx.attr.params.keys()):
        args.add("-D", "%s=%s" % (key, ctx.attr.params[key]))
    include_dirs = {}
    for f in ctx.files.includes:
        include_dirs[f.dirname] = True
    include_dirs[ctx.file.src.dirname] = True
    for d in sorted(include_dirs.keys()):
        args.add("-I", d)
    ctx.actions.run(
        executable = tools.assembler,
        arguments = [args],
        inputs = [ctx.file.src] + ctx.files.includes,
        outputs = [obj, meta],
        mnemonic = "IpuAssemble",
        progress_message = "Assembling IPU kernel %s for %s" % (name, arch),
    )
    return [
        IpuKernelInfo(name = name, source = ctx.file.src, object = obj, metadata = meta, params = ctx.attr.params, arch = arch),
        DefaultInfo(files = depset([obj, meta]), runfiles = ctx.runfiles(files = [obj, meta])),
    ]

ipu_kernel = rule(
    implementation = _ipu_kernel_impl,
    attrs = {
        "src": attr.label(allow_single_file = [".S", ".s"], mandatory = True),
        "includes": attr.label_list(allow_files = [".S", ".s", ".inc", ".h"]),
        "params": attr.string_dict(doc = "The specialisation: -D NAME=VALUE for the assembler"),
        "kernel_name": attr.string(doc = "Defaults to the target name"),
        "arch": attr.string(doc = "Overrides --//toolchains/ipu:arch for this kernel"),
        "_arch_flag": attr.label(default = "//toolchains/ipu:arch"),
    },
    toolchains = [IPU_TOOLCHAIN_TYPE],
    doc = "Assembles one kernel source with one set of parameters: one action, one object.",
)

def _ipu_kernel_library_impl(ctx):
    kernels = [k[IpuKernelInfo] for k in ctx.attr.kernels]
    transitive = [lib[IpuKernelLibraryInfo].kernels for lib in ctx.attr.deps]
    all_kernels = depset(kernels, transitive = transitive)
    seen = {}
    entries = {}
    for k in all_kernels.to_list():
        if k.name in seen:
            fail("%s: two kernels are named %r (%s and %s)" % (ctx.label, k.name, seen[k.name], k.source.path))
        seen[k.name] = k.source.path
        entries[k.name] = struct(
            name = k.name,
            arch = k.arch,
            source = k.source.path,
            object = k.object.path,
            metadata = k.metadata.path,
            params = k.params,
        )
    index = ctx.actions.declare_file(ctx.label.name + ".library.json")
    ctx.actions.write(index, json.encode_indent(struct(kernels = [entries[n] for n in sorted(entries.keys())]), indent = "  ") + "\n")
    files = depset(
        [index] + [f for k in kernels for f in [k.object, k.metadata]],
        transitive = [lib[IpuKernelLibraryInfo].files for lib in ctx.attr.deps],
    )
    return [
        IpuKernelLibraryInfo(kernels = all_kernels, index = index, files = files),
        DefaultInfo(files = files, runfiles = ctx.runfiles(transitive_files = files)),
    ]

ipu_kernel_library = rule(
    implementation = _ipu_kernel_library_impl,
    attrs = {
        "kernels": attr.label_list(providers = [IpuKernelInfo]),
        "deps": attr.label_list(providers = [IpuKernelLibraryInfo]),
    },
    doc = "A set of kernels with one index file, as one provider for packages to consume.",
)

def kernels_of_package():
    """Labels of every `ipu_kernel` declared so far in the calling BUILD file.

    A library built from this list cannot leave out a kernel its package
    declares; call it after the last `ipu_kernel`. A `.S` file of the
    package that no `ipu_kernel` assembles is a loading error, so a new
    kernel source cannot be left out of the library either.
    """
    kernels = [
        (name, rule)
        for name, rule in sorted(native.existing_rules().items())
        if rule["kind"] == "ipu_kernel"
    ]
    assembled = {}
    for _, rule in kernels:
        assembled[str(rule["src"]).split(":")[-1]] = True
    for source in native.glob(["*.S"]):
        if source not in assembled:
            fail("%s/%s: no ipu_kernel assembles this kernel source, so no library would hold it" % (native.package_name(), source))
    return [":" + name for name, _ in kernels]
